"""Frozen, self-validating configuration: the model (from config.json), the engine, sampling.

Every dataclass checks itself in ``__post_init__``; an invalid value raises ``ConfigError``
naming the field, the value and the allowed range. The CLI and the API only build these.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outpace.registry import MODELS


class ConfigError(ValueError):
    """A configuration value is outside its allowed range."""


def _require(owner: str, name: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{owner}.{name}={value!r} is invalid: must be {allowed}")


def _positive_int(owner: str, name: str, value: Any) -> None:
    _require(owner, name, value, isinstance(value, int) and not isinstance(value, bool) and value > 0,
             "a positive integer")


SUPPORTED_ARCHITECTURES = tuple(MODELS)  # the one list of architectures is the registry's

ROPE_TYPES = ("default", "llama3", "linear", "yarn")  # the rope_type values layers/rotary.py implements


@dataclass(frozen=True)
class ModelConfig:
    """The parts of a Hugging Face ``config.json`` that outpace's models read."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False      # biases on q_proj, k_proj, v_proj
    attention_out_bias: bool = False  # a bias on o_proj
    mlp_bias: bool = False            # biases on gate_proj, up_proj, down_proj
    hidden_act: str = "silu"          # the MLP's gate activation: a key of layers/activation.py's ACTIVATIONS
    qk_norm: bool = False
    # Per decoder layer: its sliding attention window (None: full attention); () when every layer is full.
    layer_windows: tuple[int | None, ...] = ()
    torch_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()
    # Multi-token-prediction layers stored after the decoder layers (DeepSeek-V3 layout).
    num_nextn_predict_layers: int = 0
    # Chain-style MTP (Step-3.5-Flash): layer k consumes layer k-1's pre-norm hidden state.
    chain_mtp_hidden_states: bool = False
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        o = "ModelConfig"
        _require(o, "architecture", self.architecture, self.architecture in SUPPORTED_ARCHITECTURES,
                 f"one of {', '.join(SUPPORTED_ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            _positive_int(o, name, getattr(self, name))
        _require(o, "num_key_value_heads", self.num_key_value_heads,
                 self.num_attention_heads % self.num_key_value_heads == 0,
                 f"a divisor of num_attention_heads={self.num_attention_heads}")
        _require(o, "rms_norm_eps", self.rms_norm_eps, 0 < self.rms_norm_eps < 1, "in (0, 1)")
        _require(o, "rope_theta", self.rope_theta, self.rope_theta > 0, "> 0")
        _require(o, "torch_dtype", self.torch_dtype, self.torch_dtype in ("float32", "float16", "bfloat16"),
                 "one of float32, float16, bfloat16")
        _require(o, "num_nextn_predict_layers", self.num_nextn_predict_layers,
                 isinstance(self.num_nextn_predict_layers, int) and self.num_nextn_predict_layers >= 0,
                 "an integer >= 0")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            _require(o, "rope_scaling.rope_type", kind, kind in ROPE_TYPES, f"one of {', '.join(ROPE_TYPES)}")
            for key in ("factor", "original_max_position_embeddings") if kind == "yarn" else ():
                value = self.rope_scaling.get(key)  # transformers _compute_yarn_parameters reads both
                _require(o, f"rope_scaling.{key}", value, isinstance(value, (int, float)) and value > 0,
                         "a number > 0 for YaRN")
        from outpace.layers.activation import ACTIVATIONS

        _require(o, "hidden_act", self.hidden_act, self.hidden_act in ACTIVATIONS,
                 f"one of {', '.join(ACTIVATIONS)} (activations with learned parameters are not implemented)")
        _require(o, "layer_windows", self.layer_windows,
                 len(self.layer_windows) in (0, self.num_hidden_layers)
                 and all(w is None or (isinstance(w, int) and w > 0) for w in self.layer_windows),
                 f"empty or {self.num_hidden_layers} entries, each None or a positive integer")

    def layer_window(self, layer: int) -> int | None:
        """Decoder layer ``layer``'s sliding attention window: a query at position p sees the keys at
        positions p - window + 1 .. p; None means full causal attention."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or [cfg.get("model_type", "<missing>")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"ModelConfig.architecture={arch!r} is not supported: must be one of "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        cfg = _text_model_config(cfg)
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        if isinstance(rope_theta, list):  # Step3p5: one theta per layer (models/step3p5.py reads them all)
            rope_theta = rope_theta[0]
        if rope_theta is None and isinstance(cfg.get("rope_parameters"), dict):  # transformers >= 5
            rope_theta = cfg["rope_parameters"].get("rope_theta")
            if cfg["rope_parameters"].get("rope_type", "default") != "default":
                rope_scaling = cfg["rope_parameters"]
        _refuse_unimplemented(arch, cfg)
        # transformers' NemotronHConfig derives the layer count from its pattern and does not save it
        num_layers = cfg.get("num_hidden_layers") or len(cfg.get("layers_block_type") or
                                                         cfg.get("hybrid_override_pattern") or ())
        # Biases, as each transformers class builds its layers: Llama (LlamaAttention, LlamaMLP) and
        # Qwen3 put attention_bias on q/k/v/o, Llama mlp_bias on gate/up/down; Qwen2Attention has
        # biases on q/k/v only, always; Mistral has none.
        attention_bias = bool(cfg.get("attention_bias", False)) if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") \
            else arch == "Qwen2ForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            # Step3p5 names its kv heads num_attention_groups (vLLM step3p5.py)
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg.get("num_attention_groups") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            attention_out_bias=attention_bias and arch != "Qwen2ForCausalLM",
            mlp_bias=arch == "LlamaForCausalLM" and bool(cfg.get("mlp_bias", False)),
            hidden_act=cfg.get("hidden_act", cfg.get("hidden_activation", "silu")),  # Gemma: hidden_activation
            qk_norm=arch == "Qwen3ForCausalLM",
            layer_windows=_layer_windows(arch, cfg, num_layers),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            eos_token_ids=eos_ids,
            num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers", 0)),
            chain_mtp_hidden_states=bool(cfg.get("chain_mtp_hidden_states", False)),
            raw=cfg,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config.json in model directory {str(model_dir)!r}")
        return cls.from_dict(json.loads(path.read_text()))


# Architectures whose attention rotates part of each head (models/qwen3_next.py reads the factor).
PARTIAL_ROTARY_ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM")


def _refuse_unimplemented(arch: str, cfg: dict) -> None:
    """Refuse config.json entries outside the four classes' own fields that would change what the
    model computes and that outpace does not implement."""
    if cfg.get("quantization_config") is not None:
        raise ConfigError(f"ModelConfig.quantization_config={cfg['quantization_config']!r} is not supported: "
                          "outpace loads unquantized checkpoints only")
    for key in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(key)
        # transformers modeling_rope_utils: rotate only int(head_dim * partial_rotary_factor) dimensions.
        factor = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else 1.0
        _require("ModelConfig", f"{key}.partial_rotary_factor", factor,
                 factor == 1.0 or arch in PARTIAL_ROTARY_ARCHITECTURES,
                 f"1.0 (partial rotary embeddings are implemented for {', '.join(PARTIAL_ROTARY_ARCHITECTURES)})")


def _text_model_config(cfg: dict) -> dict:
    """A multimodal checkpoint's config.json (a ForConditionalGeneration with a ``text_config``) -> its
    text model's config, with the top level's architectures, eos ids, dtype, quantization and tying where
    it gives them (transformers ties a Gemma3ForConditionalGeneration's head by the top level's
    tie_word_embeddings). Any other config as it is."""
    if not isinstance(cfg.get("text_config"), dict):
        return cfg
    top = ("architectures", "eos_token_id", "dtype", "torch_dtype", "quantization_config", "tie_word_embeddings")
    return {**cfg["text_config"], **{k: cfg[k] for k in top if cfg.get(k) is not None}}


def _layer_windows(arch: str, cfg: dict, num_layers: int) -> tuple[int | None, ...]:
    """Each decoder layer's sliding window (None: full attention), as the transformers classes
    compute it; () when every layer is full."""
    if arch == "MistralForCausalLM":
        # transformers MistralConfig: sliding_window defaults to 4096; MistralAttention applies it to every layer.
        window = cfg.get("sliding_window", 4096)
        windows = (window,) * num_layers
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        # transformers Qwen2Config / Qwen3Config.__post_init__: sliding_window only with use_sliding_window;
        # without layer_types, the layers from max_window_layers on slide. Qwen2Attention: a layer of type
        # "sliding_attention" uses sliding_window (and create_sliding_window_causal_mask needs one).
        window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
        types = cfg.get("layer_types") or [
            "sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28) else "full_attention"
            for i in range(num_layers)]
        _require("ModelConfig", "layer_types", types,
                 len(types) == num_layers and set(types) <= {"full_attention", "sliding_attention"}
                 and (window is not None or "sliding_attention" not in types),
                 f"{num_layers} entries of full_attention or sliding_attention (sliding only with "
                 "use_sliding_window and a sliding_window)")
        windows = tuple(window if t == "sliding_attention" else None for t in types)
    elif arch.startswith(("Gemma3", "Gemma4")):
        # transformers Gemma3TextConfig / Gemma4TextConfig.__post_init__: without layer_types, every
        # sliding_window_pattern-th layer (Gemma 4: every 6th) is full and the others slide; Gemma 4
        # forces its last layer to full. Gemma3Attention / Gemma4TextAttention: sliding layers use sliding_window.
        gemma3 = arch.startswith("Gemma3")
        window = cfg.get("sliding_window", 4096 if gemma3 else 512)
        pattern = cfg.get("sliding_window_pattern", 6) if gemma3 else 6
        types = list(cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                                for i in range(num_layers)])
        if not gemma3 and types:
            types[-1] = "full_attention"
        _require("ModelConfig", "layer_types", types,
                 len(types) == num_layers and set(types) <= {"full_attention", "sliding_attention"}
                 and (window is not None or "sliding_attention" not in types),
                 f"{num_layers} entries of full_attention or sliding_attention (sliding only with a sliding_window)")
        windows = tuple(window if t == "sliding_attention" else None for t in types)
    else:  # LlamaConfig has no sliding window
        window, windows = None, ()
    _require("ModelConfig", "sliding_window", window,
             all(w is None or (isinstance(w, int) and not isinstance(w, bool) and w > 0) for w in windows),
             "None or a positive integer")
    return windows if any(w is not None for w in windows) else ()


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on a request's output, compiled into a token mask by outpace/structured/ (names as
    vLLM's ``StructuredOutputsParams``). Exactly one field is set:

    ``json``: a JSON schema (a dict or its JSON text); ``json_object``: any JSON object; ``regex``: a
    regular expression the whole output matches; ``choice``: one of these strings; ``grammar``: an EBNF
    grammar (GBNF, the form xgrammar reads, rule ``root`` first)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        o = "StructuredOutputsParams"
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
            _require(o, "choice", self.choice, len(self.choice) > 0 and all(isinstance(c, str) and c
                                                                             for c in self.choice),
                     "a non-empty list of non-empty strings")
        _require(o, "json", self.json, self.json is None or isinstance(self.json, (str, dict)),
                 "a JSON schema: a dict or its JSON text")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            _require(o, name, value, value is None or (isinstance(value, str) and value.strip() != ""),
                     "a non-empty string")
        _require(o, "json_object", self.json_object, self.json_object in (None, True, False), "a bool")
        chosen = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        chosen += ["json_object"] if self.json_object else []
        if len(chosen) != 1:
            raise ConfigError(f"{o} needs exactly one of json, regex, choice, grammar, json_object; "
                              f"got {', '.join(chosen) or 'none'}")

    @property
    def kind(self) -> str:
        """Which constraint is set: json, regex, choice, grammar or json_object."""
        return next(name for name in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, name))


MAX_LOGPROBS = 20  # top_logprobs per position a request may ask for (vLLM's default max_logprobs and OpenAI's limit)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters (names, defaults and meanings follow vLLM's SamplingParams).

    temperature 0 means greedy. ``top_k`` 0 or -1 disables top-k; ``top_p`` 1 and ``min_p`` 0
    disable theirs. ``max_tokens`` counts generated tokens.

    ``n`` completions are returned per prompt, the best ``n`` of ``best_of`` sampled ones by cumulative
    log-probability (``LLM.generate`` fans them out; an engine request is one sequence).
    Penalties act on the target's logits at every position (a verified draft prefix counting as
    committed): ``repetition_penalty`` divides positive logits (multiplies negative ones) of tokens
    seen in the prompt or the output; ``frequency_penalty`` subtracts itself times a token's count in
    the output, ``presence_penalty`` itself once per token present in it. ``logit_bias`` adds to
    given token ids' logits (before the penalties, as vLLM orders them).
    ``logprobs`` k: each output token's log-probability, its rank and the k most likely tokens';
    ``prompt_logprobs`` k: the same for every prompt token but the first (offline API). They are the
    target's raw log-probabilities (log-softmax of the logits before any processing: vLLM's default
    ``raw_logprobs`` mode), identical with and without speculation.
    ``structured_outputs``: the output must follow a JSON schema, a regex, a choice or a grammar.
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        o = "SamplingParams"
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        real = (int, float)

        def finite(v: Any) -> bool:
            return isinstance(v, real) and not isinstance(v, bool) and math.isfinite(v)

        _positive_int(o, "n", self.n)
        _require(o, "best_of", self.best_of, self.best_of is None or (
            isinstance(self.best_of, int) and not isinstance(self.best_of, bool) and self.best_of >= self.n),
            f"None or an integer >= n={self.n}")
        _require(o, "temperature", self.temperature, finite(self.temperature) and self.temperature >= 0,
                 "a finite number >= 0")
        _require(o, "top_p", self.top_p,
                 isinstance(self.top_p, real) and 0 < self.top_p <= 1, "in (0, 1]")
        _require(o, "top_k", self.top_k,
                 isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= -1,
                 "-1 or 0 (disabled) or a positive integer")
        _require(o, "min_p", self.min_p, isinstance(self.min_p, real) and 0 <= self.min_p <= 1, "in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(o, name, value, finite(value) and -2 <= value <= 2, "in [-2, 2]")
        _require(o, "repetition_penalty", self.repetition_penalty,
                 finite(self.repetition_penalty) and self.repetition_penalty > 0, "a finite number > 0")
        if self.logit_bias is not None:
            _require(o, "logit_bias", self.logit_bias, isinstance(self.logit_bias, dict) and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 and finite(b)
                for t, b in self.logit_bias.items()), "a dict of token id (int >= 0) -> finite bias")
            object.__setattr__(self, "logit_bias", {int(t): float(b) for t, b in self.logit_bias.items()} or None)
        _positive_int(o, "max_tokens", self.max_tokens)
        _require(o, "stop", self.stop, all(isinstance(s, str) and s for s in self.stop),
                 "non-empty strings")
        _require(o, "stop_token_ids", self.stop_token_ids,
                 all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "non-negative integers")
        _require(o, "seed", self.seed, self.seed is None or (isinstance(self.seed, int) and self.seed >= 0),
                 "None or an integer >= 0")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(o, name, value, value is None or (isinstance(value, int) and not isinstance(value, bool)
                                                       and 0 <= value <= MAX_LOGPROBS),
                     f"None or an integer in [0, {MAX_LOGPROBS}]")
        _require(o, "structured_outputs", self.structured_outputs,
                 self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
                 "None or a StructuredOutputsParams")
        if self.structured_outputs is not None:
            # NOTE: the grammar ends at its stop token (an eos id); past it nothing may be committed.
            _require(o, "ignore_eos", self.ignore_eos, not self.ignore_eos,
                     "False with structured_outputs (the grammar ends with an end-of-sequence token)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the logits are changed before sampling (penalties or logit_bias)."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 \
            or self.repetition_penalty != 1

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafter proposes tokens, and how many.

    ``num_steps`` autoregressive draft steps with ``topk`` branches each (topk 1: a chain);
    ``num_draft_tokens`` tokens are verified per step, the first being the last accepted token
    (a chain verifies num_steps + 1). None derives it: num_steps + 1 for a chain.
    ``adaptive``: each step chooses how many to draft, up to that shape (speculative/adaptive.py).
    None: adaptive unless num_steps or num_draft_tokens was given (then they fix the shape).
    """

    method: str = "none"
    draft: str | None = None
    num_steps: int | None = None  # None: 5
    adaptive: bool | None = None
    topk: int = 1
    num_draft_tokens: int | None = None
    ngram_min: int = 2  # n-gram lookup: shortest and longest suffix matched
    ngram_max: int = 4

    def __post_init__(self) -> None:
        from outpace.registry import PROPOSERS

        o = "SpeculativeConfig"
        if self.adaptive is None:
            object.__setattr__(self, "adaptive", self.num_steps is None and self.num_draft_tokens is None)
        if self.num_steps is None:
            object.__setattr__(self, "num_steps", 5)
        methods = ("none", *PROPOSERS)
        _require(o, "method", self.method, self.method in methods, f"one of {', '.join(methods)}")
        _positive_int(o, "num_steps", self.num_steps)
        _positive_int(o, "topk", self.topk)
        if self.num_draft_tokens is None:
            object.__setattr__(self, "num_draft_tokens", self.num_steps + 1 if self.topk == 1 else
                               min(1 + self.topk * self.num_steps, 16))
        _positive_int(o, "num_draft_tokens", self.num_draft_tokens)
        if self.topk == 1:
            _require(o, "num_draft_tokens", self.num_draft_tokens, self.num_draft_tokens == self.num_steps + 1,
                     f"num_steps + 1 = {self.num_steps + 1} for a chain (topk 1)")
        else:
            most = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
            _require(o, "num_draft_tokens", self.num_draft_tokens, 2 <= self.num_draft_tokens <= most,
                     f"in [2, {most}] (1 + topk + (num_steps - 1) * topk^2 candidates) for topk {self.topk}")
        _positive_int(o, "ngram_min", self.ngram_min)
        _require(o, "ngram_max", self.ngram_max, isinstance(self.ngram_max, int) and self.ngram_max >= self.ngram_min,
                 f"an integer >= ngram_min={self.ngram_min}")
        if self.method != "none":
            _require(o, "draft", self.draft, self.method in ("ngram", "mtp") or bool(self.draft),
                     f"a draft checkpoint directory for method {self.method!r}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"


def default_device() -> str:
    """What device 'auto' means here: 'cuda' when torch sees a GPU, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_device(device: str) -> str:
    """'auto' -> ``default_device()``; a CUDA device torch cannot use is refused."""
    import torch

    if device == "auto":
        return default_device()
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ConfigError(f"EngineConfig.device={device!r} is invalid: torch {torch.__version__} ({build}) sees "
                              f"no GPU here; use device 'cpu' or 'auto'")
        index = device.partition(":")[2]
        _require("EngineConfig", "device", device, index == "" or (index.isdigit() and
                                                                     int(index) < torch.cuda.device_count()),
                 f"'cuda' or 'cuda:N' with N < {torch.cuda.device_count()} (the GPUs torch sees)")
    return device


CPU_KV_BLOCKS = 512  # the CPU pool without num_kv_blocks or cpu_memory_utilization


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: device, precision, cache size and batching limits.

    ``num_kv_blocks`` of ``block_size`` tokens each form the paged KV pool; None sizes it from memory
    (engine/memory.py; the start-up log says what was chosen): on CUDA the engine may use
    ``gpu_memory_utilization`` of the GPU's memory in all (weights, activation workspace, CUDA graphs, state
    slots, KV); on the CPU, with ``cpu_memory_utilization`` set, that share of the RAM still available once
    the models are loaded, and without it ``CPU_KV_BLOCKS`` blocks (small runs and tests start at once).
    ``max_num_batched_tokens`` bounds the tokens of one forward (prefill is chunked to fit).
    ``enable_prefix_caching``: reuse full KV blocks across requests sharing a prefix (cache/prefix_cache.py);
    None turns it on wherever the models allow (not on hybrid targets or recurrent drafts, whose state is not
    cached at block boundaries), True demands it (refused where it cannot work), False turns it off.
    """

    model: str
    tokenizer: str | None = None
    device: str = "auto"  # "auto": cuda when torch sees a GPU, else cpu (resolved at construction)
    dtype: str = "auto"
    seed: int = 0
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    cpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    attention_backend: str = "auto"  # "auto": triton on CUDA, torch on the CPU
    # Capture the decode iteration at start-up (every bucket, draft shape, sampling mode); CUDA only.
    cuda_graphs: bool = True
    # The batch sizes captured (vLLM's --cuda-graph-sizes, SGLang's --cuda-graph-bs); None: 1, 2, 4, 8, 16, 32,
    # 48, 64, 96, 128, 192, 256 below max_num_seqs, and max_num_seqs. A batch above the largest runs eagerly.
    cuda_graph_sizes: tuple[int, ...] | None = None
    # Captured decode steps (any drafter, any sampling) launch the next step before the host has read
    # the current step's tokens (its inputs are the slot state on the device), so the host's
    # scheduling overlaps the GPU's forward: engine/runner.py.
    run_ahead: bool = True
    # Deterministic mode: batch-invariant projections (layers/linear.py) and attention (the Triton
    # backend's invariant variant) on CUDA, so a verify forward and a decode step give each row the
    # same bits and greedy chain speculation can match plain decoding exactly in bf16 too.
    # Process-wide while an engine with it set exists; slower.
    batch_invariant: bool = False
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    load_format: str = "safetensors"  # "dummy": random weights of the checkpoint's shape (benchmarks)
    # Ranks the model is sharded over (outpace/distributed/): one process each, started by outpace or by
    # torchrun; NCCL between GPUs, gloo between CPU processes.
    tensor_parallel_size: int = 1

    @property
    def kv_blocks_from_memory(self) -> bool:
        """Whether the engine sizes the KV pool from memory (the class docstring)."""
        return self.num_kv_blocks is None and (self.device.startswith("cuda") or self.cpu_memory_utilization is not None)

    def __post_init__(self) -> None:
        o = "EngineConfig"
        _require(o, "device", self.device, self.device in ("auto", "cpu") or self.device.startswith("cuda"),
                 "'auto', 'cpu' or 'cuda[:N]'")
        object.__setattr__(self, "device", _resolve_device(self.device))
        _require(o, "dtype", self.dtype, self.dtype in ("auto", "float32", "float16", "bfloat16"),
                 "one of auto, float32, float16, bfloat16")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            _positive_int(o, name, getattr(self, name))
        if self.num_kv_blocks is not None:
            _positive_int(o, "num_kv_blocks", self.num_kv_blocks)
        for name in ("gpu_memory_utilization", "cpu_memory_utilization"):
            value = getattr(self, name)
            _require(o, name, value, (value is None and name.startswith("cpu")) or (
                isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1),
                "a fraction in (0, 1]")
        _require(o, "enable_prefix_caching", self.enable_prefix_caching,
                 self.enable_prefix_caching in (None, True, False), "None (on where supported), True or False")
        _require(o, "seed", self.seed, isinstance(self.seed, int) and self.seed >= 0, "an integer >= 0")
        if self.max_model_len is not None:
            _positive_int(o, "max_model_len", self.max_model_len)
        if self.cuda_graph_sizes is not None:
            sizes = self.cuda_graph_sizes
            _require(o, "cuda_graph_sizes", sizes, isinstance(sizes, (tuple, list)) and len(sizes) > 0 and all(
                isinstance(n, int) and not isinstance(n, bool) and 0 < n <= self.max_num_seqs for n in sizes),
                f"None or batch sizes in [1, max_num_seqs={self.max_num_seqs}]")
            object.__setattr__(self, "cuda_graph_sizes", tuple(sorted(set(sizes))))
        _require(o, "attention_backend", self.attention_backend,
                 self.attention_backend in ("auto", "torch", "triton"), "one of auto, torch, triton")
        _require(o, "load_format", self.load_format, self.load_format in ("safetensors", "dummy"),
                 "'safetensors' or 'dummy'")
        _positive_int(o, "tensor_parallel_size", self.tensor_parallel_size)
        _require(o, "device", self.device, self.tensor_parallel_size == 1 or self.device in ("cpu", "cuda"),
                 "'cpu' or 'cuda' with tensor_parallel_size > 1 (each rank takes the GPU of its local rank)")
