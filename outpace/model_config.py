"""The model's configuration: the parts of a Hugging Face ``config.json`` that outpace's models read.

``ModelConfig.from_dict`` reads the fields of transformers' common layout (``COMMON_FIELDS``); what a
family reads otherwise (its own field names, biases, per-layer sliding windows) its model class says
through the hooks of outpace/models/config_hooks.py, found by architecture in outpace/registry.py. No
family is named here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outpace.registry import MODELS, model_class
from outpace.validation import ConfigError, require, require_positive_int

SUPPORTED_ARCHITECTURES = tuple(MODELS)  # the one list of architectures is the registry's

# the rope_type values layers/rotary.py implements
ROPE_TYPES = ("default", "llama3", "linear", "yarn")


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
    attention_bias: bool = False  # biases on q_proj, k_proj, v_proj
    attention_out_bias: bool = False  # a bias on o_proj
    mlp_bias: bool = False  # biases on gate_proj, up_proj, down_proj
    hidden_act: str = (
        "silu"  # the MLP's gate activation: a key of layers/activation.py's ACTIVATIONS
    )
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
        require(
            o,
            "architecture",
            self.architecture,
            self.architecture in SUPPORTED_ARCHITECTURES,
            f"one of {', '.join(SUPPORTED_ARCHITECTURES)}",
        )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            require_positive_int(o, name, getattr(self, name))
        require(
            o,
            "num_key_value_heads",
            self.num_key_value_heads,
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"a divisor of num_attention_heads={self.num_attention_heads}",
        )
        require(o, "rms_norm_eps", self.rms_norm_eps, 0 < self.rms_norm_eps < 1, "in (0, 1)")
        require(o, "rope_theta", self.rope_theta, self.rope_theta > 0, "> 0")
        require(
            o,
            "torch_dtype",
            self.torch_dtype,
            self.torch_dtype in ("float32", "float16", "bfloat16"),
            "one of float32, float16, bfloat16",
        )
        require(
            o,
            "num_nextn_predict_layers",
            self.num_nextn_predict_layers,
            isinstance(self.num_nextn_predict_layers, int) and self.num_nextn_predict_layers >= 0,
            "an integer >= 0",
        )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            require(
                o,
                "rope_scaling.rope_type",
                kind,
                kind in ROPE_TYPES,
                f"one of {', '.join(ROPE_TYPES)}",
            )
            # transformers _compute_yarn_parameters reads both
            for key in ("factor", "original_max_position_embeddings") if kind == "yarn" else ():
                value = self.rope_scaling.get(key)
                require(
                    o,
                    f"rope_scaling.{key}",
                    value,
                    isinstance(value, (int, float)) and value > 0,
                    "a number > 0 for YaRN",
                )
        # NOTE: imported here so that importing this module does not import torch (the CLI's parser).
        from outpace.layers.activation import ACTIVATIONS

        require(
            o,
            "hidden_act",
            self.hidden_act,
            self.hidden_act in ACTIVATIONS,
            f"one of {', '.join(ACTIVATIONS)} (activations with learned parameters are not implemented)",
        )
        require(
            o,
            "layer_windows",
            self.layer_windows,
            len(self.layer_windows) in (0, self.num_hidden_layers)
            and all(w is None or (isinstance(w, int) and w > 0) for w in self.layer_windows),
            f"empty or {self.num_hidden_layers} entries, each None or a positive integer",
        )

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
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        cfg = _text_model_config(cfg)
        family = model_class(arch)
        _refuse_unimplemented(family, arch, cfg)
        fields = family.config_overrides(cfg)
        for name, read in COMMON_FIELDS.items():
            if name not in fields:
                fields[name] = read(cfg, fields)
        return cls(
            architecture=arch,
            **fields,
            layer_windows=family.layer_windows(cfg, fields["num_hidden_layers"]),
            raw=cfg,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config.json in model directory {str(model_dir)!r}")
        return cls.from_dict(json.loads(path.read_text()))


def _rope_parameters(cfg: dict) -> dict:
    """Where transformers 5 reads RoPE (PreTrainedConfig.convert_rope_params_to_dict): rope_scaling,
    the older name, else rope_parameters; a top-level rope_theta only fills in a theta they lack."""
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(cfg.get(key), dict) and cfg[key]:
            return cfg[key]
    return {}


def _rope_theta(cfg: dict) -> float:
    theta = _rope_parameters(cfg).get("rope_theta", cfg.get("rope_theta"))
    return float(theta if theta is not None else 10000.0)


def _rope_scaling(cfg: dict) -> dict | None:
    """The rope parameters when their rope_type is not the default (__post_init__ checks it)."""
    params = _rope_parameters(cfg)
    return None if params.get("rope_type", params.get("type", "default")) == "default" else params


def _eos_token_ids(cfg: dict) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


# ModelConfig field -> how transformers' common config.json layout gives it, from the config and the
# fields read before it (in this order). A family's ``config_overrides`` replaces any of them.
COMMON_FIELDS: dict[str, Callable[[dict, dict[str, Any]], Any]] = {
    "vocab_size": lambda cfg, _: cfg["vocab_size"],
    "hidden_size": lambda cfg, _: cfg["hidden_size"],
    "intermediate_size": lambda cfg, _: cfg["intermediate_size"],
    "num_hidden_layers": lambda cfg, _: cfg.get("num_hidden_layers"),
    "num_attention_heads": lambda cfg, _: cfg["num_attention_heads"],
    "num_key_value_heads": lambda cfg, read: (
        cfg.get("num_key_value_heads") or read["num_attention_heads"]
    ),
    "head_dim": lambda cfg, read: (
        cfg.get("head_dim") or read["hidden_size"] // read["num_attention_heads"]
    ),
    "max_position_embeddings": lambda cfg, _: cfg.get("max_position_embeddings", 4096),
    "rms_norm_eps": lambda cfg, _: cfg.get("rms_norm_eps", 1e-6),
    "rope_theta": lambda cfg, _: _rope_theta(cfg),
    "rope_scaling": lambda cfg, _: _rope_scaling(cfg),
    "tie_word_embeddings": lambda cfg, _: bool(cfg.get("tie_word_embeddings", False)),
    "hidden_act": lambda cfg, _: cfg.get("hidden_act", "silu"),
    "torch_dtype": lambda cfg, _: str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
    "eos_token_ids": lambda cfg, _: _eos_token_ids(cfg),
    "num_nextn_predict_layers": lambda cfg, _: int(cfg.get("num_nextn_predict_layers", 0)),
    "chain_mtp_hidden_states": lambda cfg, _: bool(cfg.get("chain_mtp_hidden_states", False)),
}


def _refuse_unimplemented(family: type, arch: str, cfg: dict) -> None:
    """Refuse config.json entries outside the family's own fields that would change what the model
    computes and that outpace does not implement."""
    if cfg.get("quantization_config") is not None:
        raise ConfigError(
            f"ModelConfig.quantization_config={cfg['quantization_config']!r} is not supported: "
            "outpace loads unquantized checkpoints only"
        )
    for key in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(key)
        # transformers modeling_rope_utils: rotate only int(head_dim * partial_rotary_factor) dimensions.
        factor = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else 1.0
        require(
            "ModelConfig",
            f"{key}.partial_rotary_factor",
            factor,
            factor == 1.0 or family.partial_rotary,
            f"1.0 (partial rotary embeddings are not implemented for {arch})",
        )


def _text_model_config(cfg: dict) -> dict:
    """A multimodal checkpoint's config.json (a ForConditionalGeneration with a ``text_config``) -> its
    text model's config, with the top level's architectures, eos ids, dtype, quantization and tying where
    it gives them (transformers ties a Gemma3ForConditionalGeneration's head by the top level's
    tie_word_embeddings). Any other config as it is."""
    if not isinstance(cfg.get("text_config"), dict):
        return cfg
    top = (
        "architectures",
        "eos_token_id",
        "dtype",
        "torch_dtype",
        "quantization_config",
        "tie_word_embeddings",
    )
    return {**cfg["text_config"], **{k: cfg[k] for k in top if cfg.get(k) is not None}}
