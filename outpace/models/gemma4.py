"""Gemma 4 text models: Gemma4ForCausalLM, and the text model of a Gemma4ForConditionalGeneration
checkpoint (its vision and audio towers and embedders are skipped, with a logged note), as transformers
5's modeling_gemma4 defines them; and the dense "unified" models (gemma-4-12B: Gemma4UnifiedForCausalLM, the
text model of a Gemma4UnifiedForConditionalGeneration, whose vision and audio embedders are skipped), whose
text model transformers' modeling_gemma4_unified builds from Gemma 4's attention, MLP, norms and layer scalar
without per-layer embeddings or the MoE block (Gemma4UnifiedTextConfig drops those fields; its sliding
window defaults to 1024 rather than 512).

Beyond Gemma 3 (models/gemma.py), every feature the transformers reference enables from its config:
- plain-weight RMSNorms in float32 (``Float32RMSNorm(offset=0.0)``), attention scale 1.0 (q and k are
  RMS-normalised per head), a weightless RMSNorm on v;
- full-attention layers may be wider (their ``per_layer_config``: head_dim, and num_key_value_heads
  with attention_k_eq_v) and rotate only part of each head (proportional RoPE: layers/rotary.py);
  with attention_k_eq_v they have no v_proj: v is k_proj's output (before k's norm and RoPE);
- per-layer embeddings (hidden_size_per_layer_input > 0): a second embedding table with a slice per
  layer, mixed with a projection of the token embedding, gates a small residual branch after each MLP;
- a learned ``layer_scalar`` multiplies each layer's output;
- KV sharing (num_kv_shared_layers): the last layers compute no k and v of their own; each attends over
  the cache of the last earlier layer of its kind (its "producer"), and with use_double_wide_mlp their
  MLPs are twice as wide;
- the MoE block (enable_moe_block): a routed expert mixture beside each dense MLP, both normed and summed;
- final logit softcapping.

Refused by name (ConfigError): use_bidirectional_attention "all" (non-causal text), a rope_type other
than default and proportional, per_layer_config entries other than head_dim and num_key_value_heads.

Sliding layers mask, not free, their cache rows older than the window (as Gemma 3: models/gemma.py).
A KV-sharing layer uses its producer's ``Attention`` module, so the engine binds one cache for both;
it hands that module the producer's k and v of this forward, which the backend writes again into the
same slots (the same values) before attending.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import build_group
from outpace.distributed.sharding import Shard, mark_shard, split_evenly
from outpace.layers import sandwich_norms
from outpace.layers.activation import ACTIVATIONS
from outpace.layers.decoder import GatedMLP, HeadProjections
from outpace.layers.embedding import ScaledVocabEmbedding
from outpace.layers.fused_sandwich import (
    attention_block_fused,
    input_rows,
    qkv_fuses,
    sandwich_fuses,
    sandwich_rows_fused,
)
from outpace.layers.linear import linear
from outpace.layers.moe import (
    ExpertActivation,
    RoutedExperts,
    expert_rows_group,
    experts_and_dense_on_kernels,
    moe_on_kernels,
)
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.rotary import RotaryEmbedding
from outpace.layers.router import Routing, RoutingModule
from outpace.model_config import ModelConfig
from outpace.models.gemma import (
    GemmaForCausalLMBase,
    LayerTypeRope,
    config_flag,
    gemma_layer_windows,
    layer_type,
    layer_type_ropes,
    refuse,
)
from outpace.models.llama import ModelOutput
from outpace.models.multimodal import TextOfMultimodal
from outpace.validation import ConfigFields

ROPE_TYPES = ("default", "proportional")
# transformers Gemma4TextConfig.__post_init__'s rope_parameters when the config gives none
DEFAULT_ROPE_PARAMETERS = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1_000_000.0,
    },
}
LAYER_OVERRIDES = ("head_dim", "num_key_value_heads")  # the per_layer_config entries implemented
# Gemma4TextConfig's fields that transformers' Gemma4UnifiedTextConfig removes: refused when a unified config
# sets them
UNIFIED_ABSENT = ("hidden_size_per_layer_input", "enable_moe_block")


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer's attention shape and KV sharing."""

    head_dim: int
    num_kv_heads: int
    k_eq_v: bool  # no v_proj: v is k_proj's output
    producer: int | None  # the layer whose KV this one attends over (None: its own)
    double_wide_mlp: bool


@dataclass(frozen=True)
class Gemma4Moe:
    num_experts: int
    top_k: int
    intermediate_size: int  # of each expert


@dataclass(frozen=True)
class Gemma4Config:
    """The Gemma 4 fields of a text config (Gemma4TextConfig) beyond ``ModelConfig``'s."""

    ropes: dict[str, LayerTypeRope]  # layer type -> its RoPE
    layers: tuple[LayerShape, ...]
    final_logit_softcapping: float | None
    attention_bias: bool  # biases on q_proj, k_proj, v_proj, o_proj
    per_layer_size: int  # hidden_size_per_layer_input (0: no per-layer embeddings)
    per_layer_vocab_size: int  # vocab_size_per_layer_input
    moe: Gemma4Moe | None

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> Gemma4Config:
        raw = cfg.raw
        unified = cfg.architecture.startswith("Gemma4Unified")
        for field in UNIFIED_ABSENT if unified else ():
            if raw.get(field):
                raise refuse(
                    field,
                    raw[field],
                    "absent: a Gemma4Unified text model has no per-layer embeddings or MoE block",
                )
        if raw.get("use_bidirectional_attention") == "all":
            raise refuse(
                "use_bidirectional_attention",
                "all",
                "None or 'vision' (outpace decodes text causally)",
            )
        moe = None
        if config_flag(cfg, "enable_moe_block"):
            # Gemma4TextConfig's are None: required with the MoE block (a bare KeyError before)
            fields = ConfigFields(raw, cfg.source)
            experts = fields.integer("num_experts")
            moe = Gemma4Moe(
                experts,
                fields.integer("top_k_experts", maximum=experts),
                fields.integer("moe_intermediate_size"),
            )
        return cls(
            ropes=layer_type_ropes(
                raw.get("rope_parameters") or DEFAULT_ROPE_PARAMETERS, ROPE_TYPES
            ),
            layers=_layer_shapes(cfg),
            final_logit_softcapping=raw.get("final_logit_softcapping"),
            attention_bias=config_flag(cfg, "attention_bias"),
            per_layer_size=0 if unified else int(raw.get("hidden_size_per_layer_input", 256) or 0),
            per_layer_vocab_size=int(raw.get("vocab_size_per_layer_input", 262_144)),
            moe=moe,
        )


def _layer_overrides(cfg: ModelConfig) -> dict[int, dict]:
    """Layer index -> its per_layer_config overrides. Configs without one (written before transformers
    5.24) give global_head_dim (default 512) and, with attention_k_eq_v, num_global_key_value_heads for
    every full layer (transformers Gemma4TextConfig.__post_init__)."""
    raw = cfg.raw
    if "per_layer_config" in raw:
        overrides = {int(i): dict(o) for i, o in (raw["per_layer_config"] or {}).items()}
        for i, o in overrides.items():
            unknown = sorted(set(o) - set(LAYER_OVERRIDES))
            if unknown:
                raise refuse(
                    f"per_layer_config.{i}.{unknown[0]}",
                    o[unknown[0]],
                    f"absent (per-layer overrides of {', '.join(LAYER_OVERRIDES)} only)",
                )
        return overrides
    full = {"head_dim": raw.get("global_head_dim", 512)}
    if config_flag(cfg, "attention_k_eq_v") and raw.get("num_global_key_value_heads") is not None:
        full["num_key_value_heads"] = raw["num_global_key_value_heads"]
    return {i: full for i in range(cfg.num_hidden_layers) if layer_type(cfg, i) == "full_attention"}


def _layer_shapes(cfg: ModelConfig) -> tuple[LayerShape, ...]:
    """Each layer's shape; KV sharing as transformers Gemma4TextConfig.kv_sharing_modes: the last
    num_kv_shared_layers layers reuse the KV of the last earlier layer of their type."""
    raw, n = cfg.raw, cfg.num_hidden_layers
    overrides = _layer_overrides(cfg)
    first_shared = n - int(raw.get("num_kv_shared_layers", 0))
    types = [layer_type(cfg, i) for i in range(n)]
    producers = {
        t: max((i for i in range(first_shared) if types[i] == t), default=None) for t in set(types)
    }
    k_eq_v, double_wide = (
        config_flag(cfg, "attention_k_eq_v"),
        config_flag(cfg, "use_double_wide_mlp"),
    )
    shapes = []
    for i, t in enumerate(types):
        producer = producers[t] if i >= first_shared else None
        if i >= first_shared and producer is None:
            raise refuse(
                "num_kv_shared_layers",
                raw["num_kv_shared_layers"],
                f"small enough that an earlier layer of type {t} produces the KV layer {i} shares",
            )
        o = overrides.get(i, {})
        shapes.append(
            LayerShape(
                head_dim=o.get("head_dim", cfg.head_dim),
                num_kv_heads=o.get("num_key_value_heads", cfg.num_key_value_heads),
                k_eq_v=k_eq_v and t == "full_attention",
                producer=producer,
                double_wide_mlp=double_wide and producer is not None,
            )
        )
    return tuple(shapes)


SharedKV = dict  # layer index -> (k, v) [num_tokens, kv_heads, head_dim] of this forward, for the layers sharing it


class Gemma4Attention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        gemma: Gemma4Config,
        index: int,
        rotary: RotaryEmbedding,
        producer_attn: Attention | None,
    ) -> None:
        """``producer_attn``: for a KV-sharing layer, its producer's Attention (module docstring)."""
        super().__init__()
        shape = gemma.layers[index]
        self.index, self.shape, self.head_dim = index, shape, shape.head_dim
        d, bias, eps = shape.head_dim, gemma.attention_bias, cfg.rms_norm_eps
        # heads split over tensor-parallel ranks (layers/decoder.py); a sharing layer has no k/v projections
        p = HeadProjections(
            cfg.hidden_size,
            cfg.hidden_size,
            cfg.num_attention_heads,
            shape.num_kv_heads,
            d,
            bias,
            bias,
            with_kv=producer_attn is None,
            with_v=not shape.k_eq_v,
        )
        self.q_proj, self.o_proj = p.q_proj, p.o_proj
        self.q_norm = Float32RMSNorm(d, eps)
        self.rotary = rotary
        if producer_attn is not None:
            self.attn = producer_attn
            return
        self.k_proj = p.k_proj
        if not shape.k_eq_v:
            self.v_proj = p.v_proj
        # q/k/v (with k = v: q/k) packed by layers/decoder.py pack_projections, for the fused few-row path
        self.qkv = None
        self.k_norm = Float32RMSNorm(d, eps)
        self.v_norm = Float32RMSNorm(d, eps, with_weight=False)
        self.attn = Attention(p.heads, p.kv_heads, d, cfg.layer_window(index), scale=1.0)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, shared: SharedKV) -> torch.Tensor:
        """positions [num_tokens]; x [num_tokens, hidden] -> [num_tokens, hidden]. A producer leaves its
        k and v in ``shared`` under its index; a sharing layer takes its producer's from there."""
        n, d = x.shape[0], self.shape.head_dim
        q = self.q_norm(self.q_proj(x).view(n, -1, d))  # [num_tokens, heads, head_dim]
        if self.shape.producer is not None:
            k, v = shared[self.shape.producer]
            q, _ = self.rotary(
                positions, q, q
            )  # (the rotary layer rotates a pair; only q is new here)
        else:
            k = self.k_proj(x).view(n, -1, d)  # [num_tokens, kv_heads, head_dim]
            v = k if self.shape.k_eq_v else self.v_proj(x).view(n, -1, d)
            q, k = self.rotary(positions, q, self.k_norm(k))
            v = self.v_norm(v)
            shared[self.index] = (k, v)
        return self.o_proj(self.attn(q, k, v, positions))


class Gemma4Router(RoutingModule):
    """transformers Gemma4TextRouter: x [n, hidden] -> (weights [n, top_k] float32, expert ids [n, top_k]):
    softmax over the experts of proj(norm(x) * scale / sqrt(hidden)) (norm: RMSNorm without a weight), the
    top_k renormalised to sum to 1, each times its expert's per_expert_scale. On CUDA without autograd the
    routing kernels (layers/router.py ``RoutingModule``) with the norm, ``scale`` and 1 / sqrt(hidden) folded
    into the logits (layers/moe_routing_kernel.py ``RouterInputNorm``: the norm is one number a token) and
    per_expert_scale applied to the weights they select (``expert_scale``)."""

    def __init__(self, hidden_size: int, moe: Gemma4Moe, eps: float) -> None:
        super().__init__()
        self.routing = Routing(moe.num_experts, moe.top_k, "softmax", normalize=True)
        self.norm = Float32RMSNorm(hidden_size, eps, with_weight=False)
        self.proj = linear(hidden_size, moe.num_experts)
        self.scale = nn.Parameter(torch.ones(hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(moe.num_experts))

    def uses_kernel(self, x: torch.Tensor) -> bool:
        """``RoutingModule.uses_kernel``, for a projection of plain float weights (a quantized one: eager)."""
        return super().uses_kernel(x) and isinstance(self.proj, nn.Linear)

    def route_on_kernels(
        self, x: torch.Tensor, num_shared: int, layout: bool, row_norm=None
    ) -> tuple:
        from outpace.layers import moe_routing_kernel  # Triton: CUDA installs only

        norm = moe_routing_kernel.RouterInputNorm(self.scale, self.norm.eps, x.shape[-1] ** -0.5)
        return moe_routing_kernel.route(
            x,
            self.proj.weight,
            None,
            self.routing,
            num_shared,
            layout,
            input_norm=norm,
            expert_scale=self.per_expert_scale,
            row_norm=row_norm,  # (refused beside its own input norm)
        )

    def reference(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = (
            self.proj(self.norm(x) * self.scale * x.shape[-1] ** -0.5).float().softmax(dim=-1)
        )  # [n, experts]
        weights, ids = torch.topk(scores, self.routing.top_k, dim=-1)  # [n, top_k]
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids].float(), ids


class Gemma4Experts(RoutedExperts):
    """transformers Gemma4TextExperts: each expert's gate and up projections packed in one
    [experts, 2 * intermediate, hidden] tensor (``gate_up_proj``), down in [experts, hidden, intermediate]
    (``down_proj``); act(gate) * up between them. A ``RoutedExperts`` in that layout: (x [n, hidden],
    weights, ids [n, top_k]) -> the weighted sum of the chosen experts [n, hidden].

    Tensor parallelism as layers/moe.py's: each rank holds intermediate / size rows of every expert's gate
    and of its up (this rank's rows of each packed half) and the matching columns of down; the experts'
    partial sums are all-reduced once."""

    def __init__(self, hidden_size: int, moe: Gemma4Moe, act: str) -> None:
        group, rows, full = build_group(), expert_rows_group(), moe.intermediate_size
        size = split_evenly(full, rows.size, "moe_intermediate_size")
        super().__init__(ExpertActivation(act), stacked=(moe.num_experts, hidden_size, size))
        self.group = group
        if rows.size > 1:
            first = rows.rank * size
            mark_shard(self.gate_up_proj, Shard(1, first, size, 2 * full, blocks=2))
            mark_shard(self.down_proj, Shard(2, first, size, full))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.run(x, weights, ids), self.group)

    def routed_by(self, router: Gemma4Router, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The MoE block: x [n, hidden] (the experts' input) through the experts ``router`` chooses from h
        [n, hidden] (the stream) -> [n, hidden]. On the grouped kernels layers/moe.py ``moe_on_kernels``:
        the routing kernel also writes their block layout."""
        if self.uses_kernels(x):
            return all_reduce(moe_on_kernels(x, router, self, router_input=h), self.group)
        return self(x, *router(h))

    def routed_beside(
        self,
        router: Gemma4Router,
        h: torch.Tensor,
        x: torch.Tensor,
        mlp: nn.Module,
        mlp_x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``routed_by``, with the layer's dense MLP over mlp_x [n, hidden] (its input under its own norm)
        fused into the grouped kernels where it can be (layers/moe.py ``experts_and_dense_on_kernels``: its
        2112 rows are 3 more experts of 704 at the 26B-A4B's shape) -> (the MoE block's output, the MLP's;
        None where it did not fuse: the caller runs it). Under tensor parallelism both are this rank's
        partial sums, each all-reduced as the MLP's down_proj and ``routed_by`` reduce them."""
        if self.uses_kernels(x):
            both = experts_and_dense_on_kernels(x, router, self, mlp, mlp_x, router_input=h)
            if both is not None:
                return all_reduce(both[0], self.group), all_reduce(both[1], self.group)
        return self.routed_by(router, h, x), None


class Gemma4DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        gemma: Gemma4Config,
        index: int,
        rotary: RotaryEmbedding,
        producer_attn: Attention | None,
    ) -> None:
        super().__init__()
        hidden, eps, shape = cfg.hidden_size, cfg.rms_norm_eps, gemma.layers[index]
        norm = partial(Float32RMSNorm, hidden, eps)
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.self_attn = Gemma4Attention(cfg, gemma, index, rotary, producer_attn)
        self.mlp = GatedMLP(
            hidden, cfg.intermediate_size * (2 if shape.double_wide_mlp else 1), cfg.hidden_act
        )
        self.register_buffer("layer_scalar", torch.ones(1))  # a checkpoint tensor
        self.has_moe = gemma.moe is not None
        # the fused path writes k and v into the cache only: a layer whose KV others read runs eagerly
        self.lends_kv = any(s.producer == index for s in gemma.layers)
        if self.has_moe:
            self.router = Gemma4Router(hidden, gemma.moe, eps)
            self.experts = Gemma4Experts(hidden, gemma.moe, cfg.hidden_act)
            self.post_feedforward_layernorm_1, self.post_feedforward_layernorm_2 = norm(), norm()
            self.pre_feedforward_layernorm_2 = norm()
        if gemma.per_layer_size:
            self.act = ACTIVATIONS[cfg.hidden_act]
            self.per_layer_input_gate = linear(hidden, gemma.per_layer_size)
            self.per_layer_projection = linear(gemma.per_layer_size, hidden)
            self.post_per_layer_input_norm = norm()

    def takes_rows(self, h: torch.Tensor) -> bool:
        """Whether the layer reads its input norm inside its fused q/k/v projection, so that the layer before
        may hand it its input as ``NormedRows`` (``forward``'s ``next_norm``) instead of a launch of the norm."""
        return not self.lends_kv and qkv_fuses(self.self_attn, h)

    def forward(
        self,
        positions: torch.Tensor,
        h,
        per_layer_input: torch.Tensor | None,
        shared: SharedKV,
        next_norm: Float32RMSNorm | None = None,
    ):
        """h [num_tokens, hidden], or ``NormedRows`` of it readied for this layer's input norm by the layer
        before (``takes_rows``); per_layer_input [num_tokens, per_layer_size] or None -> the layer's output
        [num_tokens, hidden] (transformers Gemma4TextDecoderLayer.forward), readied for ``next_norm`` when
        given (``NormedRows``) by the layer's last kernel where it has no per-layer input. Few rows on the
        GPU: the shared fused kernels (layers/fused_sandwich.py ``sandwich_rows_fused``) for a layer with its
        own KV that no other layer reads, and no MoE block; with a MoE block, its attention block alone
        (``attention_block_fused``)."""
        rows = None if isinstance(h, torch.Tensor) else h  # (NormedRows)
        h = h if rows is None else rows.stream
        if not (self.has_moe or self.lends_kv) and sandwich_fuses(self.self_attn, self.mlp, h):
            rows = rows or input_rows(self, h)
            if per_layer_input is None:
                scale = self.layer_scalar
                return sandwich_rows_fused(
                    self, positions, rows, v_norm=True, scale=scale, next_norm=next_norm
                )
            return self.per_layer_branch(
                sandwich_rows_fused(self, positions, rows, v_norm=True), per_layer_input
            )
        # (the norms and adds between the blocks: one launch each side of the MLP on CUDA, layers/sandwich_norms.py;
        # a MoE layer's attention block on the fused path where it can be)
        if self.takes_rows(h):
            attended = attention_block_fused(
                self, positions, rows or input_rows(self, h), v_norm=True
            )
        else:
            attended = self.self_attn(positions, self.input_layernorm(h), shared)
        h, pre, pre2 = sandwich_norms.after_attention(
            h,
            attended,
            self.post_attention_layernorm,
            self.pre_feedforward_layernorm,
            self.pre_feedforward_layernorm_2 if self.has_moe else None,
        )
        mlp, moe = None, {}
        if self.has_moe:  # the MoE block reads the stream the dense MLP reads, before its norm
            routed, mlp = self.experts.routed_beside(self.router, h, pre2, self.mlp, pre)
            moe = dict(
                routed=routed,
                post1=self.post_feedforward_layernorm_1,
                post2=self.post_feedforward_layernorm_2,
            )
        if mlp is None:
            mlp = self.mlp(pre)
        if per_layer_input is not None:
            h = sandwich_norms.after_mlp(h, mlp, self.post_feedforward_layernorm, **moe)
            return self.per_layer_branch(h, per_layer_input)
        post, scale = self.post_feedforward_layernorm, self.layer_scalar
        return sandwich_norms.after_mlp(h, mlp, post, scale, next_norm=next_norm, **moe)

    def per_layer_branch(self, h: torch.Tensor, per_layer_input: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] after the MLP; per_layer_input [num_tokens, per_layer_size] -> the
        layer's output: h plus the per-layer input's gated branch, times layer_scalar."""
        gate = (
            self.act(self.per_layer_input_gate(h)) * per_layer_input
        )  # [num_tokens, per_layer_size]
        return (
            h + self.post_per_layer_input_norm(self.per_layer_projection(gate))
        ) * self.layer_scalar


class Gemma4Model(nn.Module):
    def __init__(self, cfg: ModelConfig, gemma: Gemma4Config) -> None:
        super().__init__()
        hidden, n = cfg.hidden_size, cfg.num_hidden_layers
        # One table per (layer type, head_dim), shared by those layers (not checkpoint tensors).
        self.rotary = nn.ModuleDict()
        for i, shape in enumerate(gemma.layers):
            key = f"{layer_type(cfg, i)}_{shape.head_dim}"
            if key not in self.rotary:
                self.rotary[key] = gemma.ropes[layer_type(cfg, i)].rotary(
                    shape.head_dim, cfg.max_position_embeddings
                )
        self.embed_tokens = ScaledVocabEmbedding(
            cfg.vocab_size, hidden, hidden**0.5, replicated=True
        )  # (gemma.py)
        self.layers = nn.ModuleList()
        for i, shape in enumerate(gemma.layers):
            producer = (
                None if shape.producer is None else self.layers[shape.producer].self_attn.attn
            )
            rotary = self.rotary[f"{layer_type(cfg, i)}_{shape.head_dim}"]
            self.layers.append(Gemma4DecoderLayer(cfg, gemma, i, rotary, producer))
        self.norm = Float32RMSNorm(hidden, cfg.rms_norm_eps)
        self.per_layer_size = p = gemma.per_layer_size
        if p:
            self.embed_tokens_per_layer = ScaledVocabEmbedding(
                gemma.per_layer_vocab_size, n * p, p**0.5
            )
            self.per_layer_model_projection = linear(hidden, n * p)
            self.per_layer_projection_norm = Float32RMSNorm(p, cfg.rms_norm_eps)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """input_ids [n]; embeds [n, hidden] (the scaled token embeddings) -> [n, layers, per_layer_size]:
        (norm(projection(embeds) / sqrt(hidden)) + the per-layer embedding) / sqrt(2), as transformers
        Gemma4TextModel.get_per_layer_inputs and project_per_layer_inputs compute it."""
        n, p = input_ids.shape[0], self.per_layer_size
        tokens = self.embed_tokens_per_layer(input_ids).view(n, -1, p)
        projected = self.per_layer_model_projection(embeds) * embeds.shape[-1] ** -0.5
        return (self.per_layer_projection_norm(projected.view(n, -1, p)) + tokens) * 2**-0.5


class Gemma4ForCausalLM(GemmaForCausalLMBase):
    DEFAULT_WINDOW = 512  # Gemma4TextConfig's sliding_window
    # Gemma4TextConfig's (and Gemma4Config's tie_word_embeddings)
    class_defaults = {
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "head_dim": 256,
        "num_key_value_heads": 4,
    }

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # Gemma4TextConfig: every 6th layer full, the last always
        window = cfg.optional_integer("sliding_window", cls.DEFAULT_WINDOW)
        return gemma_layer_windows(cfg, num_layers, window, 6, last_full=True)

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        super().__init__(cfg, mtp_own_heads, Gemma4Config.from_model_config(cfg), Gemma4Model)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """input_ids, positions [num_tokens] -> the last layer's output [num_tokens, hidden], before the final norm."""
        h = self.embed(input_ids)  # [num_tokens, hidden]
        per_layer = self.model.per_layer_inputs(input_ids, h) if self.model.per_layer_size else None
        captured, shared, layers = {}, {}, self.model.layers
        for i, layer in enumerate(layers):  # (h: a tensor, or NormedRows the layer before readied)
            stream = h if isinstance(h, torch.Tensor) else h.stream
            if i in self.aux_layer_ids:
                captured[i] = stream
            after = layers[i + 1] if i + 1 < len(layers) else None
            ready = after is not None and after.takes_rows(stream)
            per_layer_input = None if per_layer is None else per_layer[:, i]
            h = layer(
                positions, h, per_layer_input, shared, after.input_layernorm if ready else None
            )
        return self._model_output(h if isinstance(h, torch.Tensor) else h.stream, captured)


class Gemma4UnifiedForCausalLM(Gemma4ForCausalLM):
    """Gemma 4's dense unified text model (module docstring)."""

    DEFAULT_WINDOW = 1024  # Gemma4UnifiedTextConfig's sliding_window
    # Gemma4UnifiedTextConfig's (and Gemma4UnifiedConfig's tie_word_embeddings)
    class_defaults = {
        "max_position_embeddings": 262144,
        "tie_word_embeddings": True,
        "head_dim": 256,
        "num_key_value_heads": 4,
    }


# A Gemma4(Unified)ForConditionalGeneration checkpoint keeps its text model under ``model.language_model.`` (its
# head, when not tied, stays ``lm_head.weight``), as transformers' save_pretrained writes it.
class Gemma4TextForCausalLM(TextOfMultimodal, Gemma4ForCausalLM):
    """A Gemma4ForConditionalGeneration checkpoint's text model; what it holds beside (transformers Gemma4Model)
    skipped."""

    TOWERS = tuple(
        f"model.{p}" for p in ("vision_tower", "embed_vision", "audio_tower", "embed_audio")
    )


class Gemma4UnifiedTextForCausalLM(TextOfMultimodal, Gemma4UnifiedForCausalLM):
    """A Gemma4UnifiedForConditionalGeneration checkpoint's text model; beside it no towers, the vision and audio
    embedders (transformers Gemma4UnifiedModel; its save_pretrained writes the vision embedder's patch layers as
    vision_embedder), skipped."""

    TOWERS = tuple(f"model.{p}" for p in ("embed_vision", "vision_embedder", "embed_audio"))
