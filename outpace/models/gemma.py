"""Gemma 3 text models: Gemma3ForCausalLM, and the text model of a Gemma3ForConditionalGeneration
checkpoint (its vision tower and multimodal projector are skipped, with a logged note).

What differs from the Llama family (models/llama.py), as transformers' modeling_gemma3 computes it:
- the embedding is scaled by sqrt(hidden_size), the scale rounded to the weights' dtype;
- every RMSNorm scales by (1 + weight), in float32 (``Float32RMSNorm(offset=1.0)``), and a layer has
  four: before and after attention, before and after the MLP (the "sandwich"); q and k have per-head norms;
- attention scores are scaled by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5;
- the MLP's gate is GELU-tanh (hidden_activation);
- sliding-window layers are interleaved with full ones (``layer_types``, or every
  sliding_window_pattern-th layer full), and each kind has its own RoPE (theta, scaling);
- Gemma3ForCausalLM's final logits may be soft-capped (final_logit_softcapping).

Sliding windows: a sliding layer's keys older than its window stay in the paged cache and are masked
(``PagedAttentionMetadata.attn_mask``, as for Mistral and Qwen2), not freed: the engine keeps one block
table per request for every layer, so blocks are freed when the request ends.

Forward works on flat tokens like the Llama family: ``forward`` returns the last hidden state before
the final norm, ``compute_logits`` applies norm, head and softcapping to the rows that need logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.layers.argmax import argmax_last
from outpace.layers.decoder import GatedMLP, HeadProjections, run_layer_stack
from outpace.layers.embedding import LMHead, ScaledVocabEmbedding, softcap
from outpace.layers.fused_decoder import head_argmax_tokens, norm_head_logits, run_fused_layers
from outpace.layers.fused_sandwich import sandwich_fuses, sandwich_rows_fused
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.rotary import RotaryEmbedding
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import ConfigHooks, windows_of_layer_types
from outpace.models.drafts.eagle3_aux_ids import GEMMA_OUTPUT_IDS
from outpace.models.llama import LlamaForCausalLM, ModelOutput
from outpace.models.multimodal import llava_text_name, skip_towers
from outpace.validation import ConfigError, ConfigFields

LAYER_TYPES = ("sliding_attention", "full_attention")
ROPE_TYPES = (
    "default",
    "linear",
    "llama3",
)  # what Gemma 3 layers may use (layers/rotary.py, attention factor 1)


def refuse(field: str, value, allowed: str) -> ConfigError:
    """The error for a config.json value outpace does not implement, naming field and value."""
    return ConfigError(f"ModelConfig.{field}={value!r} is not supported: must be {allowed}")


def config_flag(cfg: ModelConfig, name: str, prefix: str = "") -> bool:
    """The switch ``name`` of ``cfg``'s config.json (``prefix``: where it sits, e.g. ``text_config.``): true or false,
    absent or null false; another value (the string "false", which bool() reads as true) refused naming the file
    and the field."""
    return ConfigFields(cfg.raw, cfg.source, prefix).boolean(name, False)


@dataclass(frozen=True)
class LayerTypeRope:
    """One layer type's RoPE: ``theta`` and ``scaling`` (None or a rope_parameters dict with a rope_type
    that layers/rotary.py implements)."""

    theta: float
    scaling: dict | None

    def rotary(self, head_dim: int, max_positions: int) -> RotaryEmbedding:
        return RotaryEmbedding(head_dim, max_positions, self.theta, self.scaling)


def layer_type_ropes(params: dict, rope_types: tuple[str, ...]) -> dict[str, LayerTypeRope]:
    """rope_parameters keyed by layer type (transformers 5's Gemma configs) -> layer type -> its RoPE;
    a rope_type outside ``rope_types`` is refused by name."""
    ropes = {}
    for layer_type in LAYER_TYPES:
        p = params[layer_type]
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in rope_types:
            raise refuse(
                f"rope_parameters.{layer_type}.rope_type", kind, f"one of {', '.join(rope_types)}"
            )
        ropes[layer_type] = LayerTypeRope(
            float(p["rope_theta"]), None if kind == "default" else dict(p)
        )
    return ropes


def _gemma3_rope_parameters(raw: dict) -> dict:
    """Gemma3TextConfig.convert_rope_params_to_dict: rope_parameters per layer type, or, in configs
    written before transformers 5, rope_theta (+ rope_scaling) for the full layers and
    rope_local_base_freq for the sliding ones; defaults 1e6 and 1e4 (Gemma3TextConfig.default_theta)."""
    params = raw.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    full.update(raw.get("rope_scaling") or {})
    full.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
    sliding = dict(params.get("sliding_attention") or {"rope_type": "default"})
    sliding.setdefault("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
    return {"full_attention": full, "sliding_attention": sliding}


@dataclass(frozen=True)
class Gemma3Config:
    """The Gemma 3 fields of a text config (Gemma3TextConfig) beyond ``ModelConfig``'s."""

    ropes: dict[str, LayerTypeRope]  # layer type -> its RoPE
    query_pre_attn_scalar: float  # attention scores are scaled by its inverse square root
    final_logit_softcapping: (
        float | None
    )  # None for a multimodal checkpoint (see from_model_config)
    attention_bias: bool  # biases on q_proj, k_proj, v_proj, o_proj
    multimodal: bool  # a Gemma3ForConditionalGeneration checkpoint

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> Gemma3Config:
        raw = cfg.raw
        # NOTE: transformers 5.24's Gemma3Attention stores attn_logit_softcapping but never applies it; a
        # checkpoint that sets it may expect either, so it is refused rather than guessed.
        if raw.get("attn_logit_softcapping") is not None:
            raise refuse(
                "attn_logit_softcapping",
                raw["attn_logit_softcapping"],
                "None (attention logit softcapping is not implemented)",
            )
        if raw.get("use_bidirectional_attention"):
            raise refuse(
                "use_bidirectional_attention",
                raw["use_bidirectional_attention"],
                "False (outpace decodes causally)",
            )
        multimodal = cfg.architecture == "Gemma3ForConditionalGeneration"
        return cls(
            ropes=layer_type_ropes(_gemma3_rope_parameters(raw), ROPE_TYPES),
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
            # transformers' Gemma3ForConditionalGeneration.forward does not soft-cap its logits (its
            # text config's final_logit_softcapping is read by Gemma3ForCausalLM only)
            final_logit_softcapping=None if multimodal else raw.get("final_logit_softcapping"),
            attention_bias=config_flag(cfg, "attention_bias"),
            multimodal=multimodal,
        )


def gemma_layer_windows(
    cfg: ConfigFields, num_layers: int, window: int | None, pattern: int, last_full: bool
) -> tuple[int | None, ...]:
    """transformers Gemma3TextConfig / Gemma4TextConfig.__post_init__: without layer_types, every
    ``pattern``-th layer is full and the others slide; Gemma 4 forces its last layer to full
    (``last_full``). Gemma3Attention / Gemma4TextAttention: sliding layers use ``window``."""
    types = list(
        cfg.strings("layer_types")
        or [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(num_layers)
        ]
    )
    if last_full and types:
        types[-1] = "full_attention"
    return windows_of_layer_types(cfg, types, window, num_layers, "a sliding_window")


def layer_type(cfg: ModelConfig, layer: int) -> str:
    """The layer's type, sliding_attention or full_attention, from its window (ModelConfig parsed them)."""
    return "full_attention" if cfg.layer_window(layer) is None else "sliding_attention"


class Gemma3Attention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        gemma: Gemma3Config,
        rotary: RotaryEmbedding,
        sliding_window: int | None,
    ) -> None:
        super().__init__()
        self.head_dim = d = cfg.head_dim
        bias = gemma.attention_bias
        p = HeadProjections(
            cfg.hidden_size,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            d,
            bias,
            bias,
        )  # heads split over tensor-parallel ranks (layers/decoder.py)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p.q_proj, p.k_proj, p.v_proj, p.o_proj
        self.q_norm = Float32RMSNorm(d, cfg.rms_norm_eps, offset=1.0)
        self.k_norm = Float32RMSNorm(d, cfg.rms_norm_eps, offset=1.0)
        self.rotary = rotary
        self.attn = Attention(
            p.heads, p.kv_heads, d, sliding_window, scale=gemma.query_pre_attn_scalar**-0.5
        )
        self.qkv = (
            None  # q/k/v packed by layers/decoder.py pack_projections, for the fused few-row path
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """positions [num_tokens]; x [num_tokens, hidden] -> [num_tokens, hidden]."""
        n, d = x.shape[0], self.head_dim
        q = self.q_norm(self.q_proj(x).view(n, -1, d))  # [num_tokens, heads, head_dim]
        k = self.k_norm(self.k_proj(x).view(n, -1, d))  # [num_tokens, kv_heads, head_dim]
        v = self.v_proj(x).view(n, -1, d)  # [num_tokens, kv_heads, head_dim]
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, positions))


class Gemma3DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        gemma: Gemma3Config,
        rotary: RotaryEmbedding,
        sliding_window: int | None,
    ) -> None:
        super().__init__()
        norm = lambda: Float32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.self_attn = Gemma3Attention(cfg, gemma, rotary, sliding_window)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether the fused path serves the stream h [num_tokens, hidden] (``sandwich_fuses``)."""
        return sandwich_fuses(self.self_attn, self.mlp, h)

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """rows: the layer's input stream made ready for its input norm (``NormedRows``) -> its output stream
        made ready for ``next_norm`` (layers/fused_sandwich.py ``sandwich_rows_fused``)."""
        return sandwich_rows_fused(self, positions, rows, next_norm=next_norm)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> h + post_norm(attention(pre_norm(h))), then the same around the MLP.
        A stack of few rows on the GPU takes ``forward_fused`` (``Gemma3ForCausalLM.forward``)."""
        h = h + self.post_attention_layernorm(self.self_attn(positions, self.input_layernorm(h)))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, gemma: Gemma3Config) -> None:
        super().__init__()
        # One table per layer type, shared by that type's layers (not checkpoint tensors).
        self.rotary = nn.ModuleDict(
            {
                t: rope.rotary(cfg.head_dim, cfg.max_position_embeddings)
                for t, rope in gemma.ropes.items()
            }
        )
        self.embed_tokens = ScaledVocabEmbedding(
            cfg.vocab_size, cfg.hidden_size, cfg.hidden_size**0.5, replicated=True
        )
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, gemma, self.rotary[layer_type(cfg, i)], cfg.layer_window(i))
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = Float32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)


class GemmaForCausalLMBase(nn.Module, ConfigHooks):
    """What the Gemma 3 and Gemma 4 causal LMs share: the family config beside the common one, the
    text model, the (tied or own) head, embedding lookup and soft-capped logits, and the aux hidden
    state capture (EAGLE3) of the Llama family: capture index i is the input of layer i, index
    num_hidden_layers the last layer's output.

    Tensor parallelism: the layers shard as the Llama family's; the token embedding stays whole on every
    rank (a plain table, as SGLang's Gemma3TextScaledWordEmbedding is an nn.Embedding), and so does a head
    tied to it: a vocab-parallel EAGLE3 draft borrowing them is handed this rank's rows
    (layers/embedding.py ``vocab_shard_of``)."""

    shards_over_ranks = True
    # transformers 5.24's Gemma3TextConfig and Gemma4TextConfig leave a top-level partial_rotary_factor out of
    # their rope_parameters keyed by layer type, so their models ignore it: here too (Gemma 4's partial rotary
    # is its full_attention rope_parameters' own factor)
    own_partial_rotary_factor = True

    set_aux_hidden_state_layers = LlamaForCausalLM.set_aux_hidden_state_layers
    _model_output = LlamaForCausalLM._model_output
    # EAGLE3 drafts for Gemma write output-of ids, default [2, L // 2, L - 2] (models/drafts/eagle3_aux_ids.py)
    eagle3_aux_ids = GEMMA_OUTPUT_IDS

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        """Gemma3TextConfig / Gemma4TextConfig name the MLP's activation ``hidden_activation`` (default
        gelu_pytorch_tanh) and ignore a ``hidden_act``: one that says otherwise is refused, not obeyed (before,
        it was, and a missing ``hidden_activation`` meant silu: tokens other than transformers')."""
        # soft-capped logits are cap * tanh(logits / cap), scores scaled by query_pre_attn_scalar ** -0.5: a 0 or
        # a string there met a NaN or a bare ValueError (a negative cap computes what its absolute value does)
        cap = cfg.number("final_logit_softcapping", None)
        if cap is not None and cap == 0:
            raise cfg.fail("final_logit_softcapping", cap, "None or a number other than 0")
        cfg.number("query_pre_attn_scalar", None, positive=True)
        act = cfg.string("hidden_activation", "gelu_pytorch_tanh")
        other = cfg.string("hidden_act", None)
        if other is not None and other != act:
            raise cfg.fail(
                "hidden_act",
                other,
                f"absent or {act!r}: Gemma's activation is hidden_activation ({act!r}), which transformers "
                "reads alone",
            )
        return {"hidden_act": act}

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool, gemma, model_class: type) -> None:
        """``mtp_own_heads`` (the loader's argument for every model) must be False: Gemma has no MTP layers.
        ``gemma``: the family's own config; ``model_class(cfg, gemma)`` builds the text model."""
        super().__init__()
        if mtp_own_heads or cfg.num_nextn_predict_layers:
            raise refuse(
                "num_nextn_predict_layers",
                cfg.num_nextn_predict_layers,
                "0 for Gemma (no MTP layers)",
            )
        self.config, self.gemma = cfg, gemma
        self.model = model_class(cfg, gemma)
        self.lm_head = LMHead(
            cfg.hidden_size,
            cfg.vocab_size,
            tied_to=self.model.embed_tokens if cfg.tie_word_embeddings else None,
        )
        self.aux_layer_ids: tuple[int, ...] = ()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def compute_logits(
        self, hidden_states: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm hidden states -> [n, vocab] float32 logits, soft-capped when configured
        (written into ``out`` if given); one fused kernel for few rows on the GPU (layers/fused_decoder.py)."""
        return norm_head_logits(
            self.model.norm, self.lm_head, hidden_states, out, self.gemma.final_logit_softcapping
        )

    def greedy_tokens(
        self, hidden_states: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm -> [R] int64 the argmax of ``compute_logits`` of rows ``rows`` [R] (all when None):
        from the head in one launch for few rows on the GPU (layers/fused_decoder.py ``head_argmax_tokens``), but
        from the logits where they are soft-capped (the cap's tanh may round apart values to one)."""
        if self.gemma.final_logit_softcapping is None:
            return head_argmax_tokens(self.lm_head, hidden_states, self.model.norm, rows)
        picked = hidden_states if rows is None else hidden_states[rows]
        return argmax_last(self.compute_logits(picked))


class Gemma3ForCausalLM(GemmaForCausalLMBase):
    # Gemma3TextConfig's (and Gemma3Config's tie_word_embeddings)
    class_defaults = {
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "head_dim": 256,
        "num_key_value_heads": 4,
    }

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        return gemma_layer_windows(
            cfg,
            num_layers,
            cfg.optional_integer("sliding_window", 4096),
            cfg.integer("sliding_window_pattern", 6),
            last_full=False,
        )

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        super().__init__(cfg, mtp_own_heads, Gemma3Config.from_model_config(cfg), Gemma3Model)
        self.ignored_checkpoint_tensors = (
            skip_towers(cfg, ("vision_tower", "multi_modal_projector"))
            if self.gemma.multimodal
            else ()
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """input_ids, positions [num_tokens] -> the last layer's output [num_tokens, hidden], before the final norm."""
        h, layers = self.embed(input_ids), self.model.layers
        # few rows on the GPU: each layer readies the next one's input norm
        if all(layer.fuses(h) for layer in layers):
            norms = [layer.input_layernorm for layer in layers]
            h, captured = run_fused_layers(
                layers, norms, self.model.norm, positions, h, self.aux_layer_ids
            )
        else:
            h, captured = run_layer_stack(layers, positions, h, self.aux_layer_ids)
        return self._model_output(h, captured)

    def checkpoint_name(self, param_name: str) -> str:
        """A Gemma3ForConditionalGeneration checkpoint keeps its text model under ``language_model.``
        (``language_model.model.layers.0...``, ``language_model.lm_head.weight``), as the Hub's and
        transformers' save_pretrained write it."""
        return llava_text_name(param_name) if self.gemma.multimodal else param_name


def final_logits(logits: torch.Tensor, cap: float | None, out: torch.Tensor | None) -> torch.Tensor:
    """Head output [n, vocab] -> float32 logits, soft-capped at ``cap`` when given, in ``out`` when given."""
    logits = logits.float()
    if cap is not None:
        logits = softcap(logits, cap)
    return logits if out is None else out.copy_(logits)
