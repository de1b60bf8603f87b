"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: Qwen3NextForCausalLM, Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM
(transformers' classes of those names are the reference), and the text models of the hub's multimodal Qwen3.5
checkpoints (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration: the text model under
``model.language_model.``, the vision tower ``model.visual`` skipped). Hybrid stacks: most layers mix tokens with gated DeltaNet
(layers/gated_deltanet.py, a recurrent state per request: layers/recurrent.py), every
``full_attention_interval``-th with gated full attention, as the config's ``layer_types`` says.

- Gated attention: q_proj gives each head's query and an output gate side by side ([heads, 2 *
  head_dim]); q and k get per-head RMSNorms with a (1 + weight) scale; RoPE turns only the first
  int(head_dim * partial_rotary_factor) dimensions (halves layout within them); the attention output is
  multiplied by sigmoid(gate) before o_proj.
- Every RMSNorm of the stack scales by (1 + weight) in float32 (transformers Qwen3NextRMSNorm, Gemma's).
- Qwen3-Next's MLP is a mixture of experts on every ``decoder_sparse_step``-th layer outside
  ``mlp_only_layers``: a softmax router keeps num_experts_per_tok experts (weights renormalised with
  norm_topk_prob), plus one shared SwiGLU expert scaled by sigmoid(shared_expert_gate(x)). On the grouped
  kernels the shared expert runs as more slots of the routed experts, weighted by its gate, which the
  routing kernel computes as one more router row (layers/gated_shared_moe.py ``RouterWithSharedGate``): the block is its router's
  two launches, gate/up, down and the combine. Qwen3.5's is a dense SwiGLU MLP, Qwen3.5-MoE's the same
  mixture on every layer, its weights always renormalised (transformers Qwen3_5MoeTextConfig drops
  decoder_sparse_step, mlp_only_layers and norm_topk_prob; Qwen3VLMoeTextTopKRouter renormalises).
- Qwen3.5's multimodal rotary sections (mrope_section) turn text positions exactly as plain RoPE does
  (the three position streams are equal), so they are not read.

Few rows on the GPU (decode, verify) run the stack in the fused residual style of the Llama layers
(layers/fused_decoder.py ``run_fused_layers``): the mixer's input projection (gated DeltaNet's packed
in-projections, the attention's q/k/v and gate) reads the stream through the norm-folding kernel, the attention
kernels apply the output gate as they store (attention/triton_kernels.py ``out_gate``), out_proj / o_proj
adds the residual and makes the stream ready for the post-attention norm, the dense MLP's gate/up folds
that norm and down_proj makes the stream ready for the next layer's norm, so no RMSNorm runs as a launch
of its own. A MoE MLP on one GPU reads the stream made ready for its norm too: the routing kernel scales
each token's logits by the norm's factor and the grouped gate/up kernel its products (layers/moe.py
``RowNorm``), and the experts' combine adds their output to the stream and makes it ready for the next
layer's norm (``ReadyStream``); under tensor parallelism it reads its input normalised in one launch, and
the all-reduce, the add and the next norm run in another (layers/fused_decoder.py ``moe_block_fused``).

The model interface is the Llama family's (models/llama.py). The checkpoints' ``mtp.*`` layers (when the
config declares them: models/drafts/hybrid_mtp.py) are ``mtp_layers``, which ``--method mtp`` drafts with
(speculative/drafters/mtp.py); each is a full-attention layer of this stack.

Tensor parallelism (outpace/distributed/), as vLLM and SGLang shard these models: the gated attention's
heads (q_proj's [query, gate] rows by head, kv heads as the Llama family's), gated DeltaNet's heads
(layers/gated_deltanet.py), the dense MLPs and every expert's rows (the shared expert's too, its scalar
gate whole), the embedding and head vocab-parallel; the MTP layers' fc and norms whole on every rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.distributed.group import build_group
from outpace.distributed.sharding import kv_head_shard, split_evenly
from outpace.layers.activation import sigmoid_gate
from outpace.layers.decoder import (
    GatedMLP,
    PackedProjection,
    pre_norm_residual,
    residual_stream,
)
from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.fused_decoder import (
    block_fuses,
    fused_weight,
    kernel_rows,
    mlp_fused,
    mlp_fuses,
    moe_block_fused,
    norm_head_logits,
    project_add_ready,
    project_normalised,
    run_stack,
)
from outpace.layers.fused_sandwich import attend_fused_qkv_gate
from outpace.layers.gated_deltanet import GatedDeltaNet
from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
from outpace.layers.linear import column_parallel, row_parallel
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.quant.linear import is_quantized
from outpace.layers.rotary import RotaryEmbedding
from outpace.layers.router import Routing
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import ConfigHooks
from outpace.models.drafts.hybrid_mtp import QwenMTP, mtp_layer_count, step_checkpoint_name
from outpace.models.llama import LlamaForCausalLM, ModelOutput
from outpace.models.multimodal import TextOfMultimodal
from outpace.validation import ConfigError, ConfigFields, require

NEXT = "Qwen3NextForCausalLM"
# Qwen3.5's mixtures (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B, Qwen3.6-35B-A3B): its text model or the hub's
# multimodal checkpoint
QWEN35_MOE = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
QWEN35_DENSE = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
# transformers' Qwen3_5MoeTextConfig drops these Qwen3NextConfig fields (every layer's MLP is the mixture, its
# router always renormalises: Qwen3VLMoeTextTopKRouter): a Qwen3.5-MoE config that sets them otherwise is refused
QWEN35_MOE_FIXED = {"decoder_sparse_step": 1, "mlp_only_layers": (), "norm_topk_prob": True}

# transformers' Qwen3NextConfig / Qwen3_5TextConfig defaults for fields a config.json may omit
DEFAULTS = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    full_attention_interval=4,
    partial_rotary_factor=0.25,
    attention_bias=False,
    decoder_sparse_step=1,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_experts_per_tok=10,
    num_experts=512,
    norm_topk_prob=True,
    mlp_only_layers=(),
)


@dataclass(frozen=True)
class Qwen3NextConfig:
    """What these models read from config.json beyond ``ModelConfig``."""

    layer_types: tuple[str, ...]  # "linear_attention" or "full_attention" per layer
    conv_width: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    rotary_dim: int  # the dimensions of a head RoPE turns
    attention_bias: bool
    moe_layers: frozenset[int]  # Qwen3-Next: the layers whose MLP is the mixture of experts
    routing: Routing | None
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    mtp_moe_layers: frozenset[int] = (
        frozenset()
    )  # the MTP layers whose MLP is the mixture of experts

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> Qwen3NextConfig:
        raw, n = {**DEFAULTS, **cfg.raw}, cfg.num_hidden_layers
        interval = raw["full_attention_interval"]
        types = tuple(
            raw.get("layer_types")
            or [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(n)
            ]
        )
        o = "ModelConfig"
        require(
            o,
            "layer_types",
            types,
            len(types) == n and set(types) <= {"linear_attention", "full_attention"},
            f"{n} entries of linear_attention or full_attention",
        )
        require(
            o,
            "linear_num_value_heads",
            raw["linear_num_value_heads"],
            raw["linear_num_value_heads"] % raw["linear_num_key_heads"] == 0,
            f"a multiple of linear_num_key_heads={raw['linear_num_key_heads']}",
        )
        rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
        factor = rope.get("partial_rotary_factor", raw["partial_rotary_factor"])
        rotary_dim = int(cfg.head_dim * factor)  # transformers Qwen3NextRotaryEmbedding
        require(
            o,
            "partial_rotary_factor",
            factor,
            0 < rotary_dim <= cfg.head_dim and rotary_dim % 2 == 0,
            f"a factor giving an even number of rotated dimensions in (0, head_dim={cfg.head_dim}]",
        )
        # Qwen's hub configs carry these two (transformers' config classes read neither): the gated attention
        # output and MTP layers sharing the target's embedding are what outpace implements
        for field, implemented in (
            ("attn_output_gate", True),
            ("mtp_use_dedicated_embeddings", False),
        ):
            given = raw.get(field, implemented)
            require(
                o, field, given, given is implemented, f"{implemented} or absent (not implemented)"
            )
        qwen35_moe = cfg.architecture in QWEN35_MOE
        for field, value in QWEN35_MOE_FIXED.items() if qwen35_moe else ():
            given = raw[field]
            require(
                o,
                field,
                given,
                (tuple(given) if isinstance(given, list) else given) == value,
                f"{value!r} or absent in a Qwen3.5 MoE config (Qwen3_5MoeTextConfig has no such field)",
            )
        if qwen35_moe:
            require(
                o, "num_experts", raw["num_experts"], raw["num_experts"] > 0, "> 0 (Qwen3.5 MoE)"
            )
        moe = (cfg.architecture == NEXT or qwen35_moe) and raw["num_experts"] > 0

        def moe_layers(
            count: int,
        ) -> frozenset[int]:  # transformers Qwen3NextDecoderLayer (vLLM's alike)
            return frozenset(
                i
                for i in range(count)
                if moe
                and i not in raw["mlp_only_layers"]
                and (i + 1) % raw["decoder_sparse_step"] == 0
            )

        if moe:
            require(
                o,
                "num_experts_per_tok",
                raw["num_experts_per_tok"],
                0 < raw["num_experts_per_tok"] <= raw["num_experts"],
                f"in [1, num_experts={raw['num_experts']}]",
            )
        return cls(
            layer_types=types,
            conv_width=raw["linear_conv_kernel_dim"],
            num_k_heads=raw["linear_num_key_heads"],
            num_v_heads=raw["linear_num_value_heads"],
            head_k_dim=raw["linear_key_head_dim"],
            head_v_dim=raw["linear_value_head_dim"],
            rotary_dim=rotary_dim,
            attention_bias=bool(raw["attention_bias"]),
            moe_layers=moe_layers(n),
            routing=Routing(
                raw["num_experts"],
                raw["num_experts_per_tok"],
                "softmax",
                normalize=bool(raw["norm_topk_prob"]),
            )
            if moe
            else None,
            moe_intermediate_size=raw["moe_intermediate_size"],
            shared_expert_intermediate_size=raw["shared_expert_intermediate_size"],
            # vLLM qwen3_next_mtp.py: layer k is MoE by the same rule at index k (models/drafts/hybrid_mtp.py)
            mtp_moe_layers=moe_layers(mtp_layer_count(raw)),
        )


class GatedAttention(nn.Module):
    """Full attention with an output gate and partial RoPE (module docstring): [n, hidden] -> [n, hidden]."""

    def __init__(self, cfg: ModelConfig, hybrid: Qwen3NextConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        group, d, h, bias = build_group(), cfg.head_dim, cfg.hidden_size, hybrid.attention_bias
        self.head_dim = d
        # heads split as layers/decoder.py's HeadProjections splits them, q_proj's rows per head doubled
        # ([query, gate] side by side: vLLM's Qwen3NextAttention shards its 2 * q_size rows by head)
        self.heads = split_evenly(cfg.num_attention_heads, group.size, "num_attention_heads")
        first_kv, kv_heads = kv_head_shard(cfg.num_key_value_heads, group.rank, group.size)
        self.q_proj = column_parallel(
            h, 2 * cfg.q_size, bias, (group.rank * self.heads * 2 * d, self.heads * 2 * d)
        )
        self.k_proj = column_parallel(h, cfg.kv_size, bias, (first_kv * d, kv_heads * d))
        self.v_proj = column_parallel(h, cfg.kv_size, bias, (first_kv * d, kv_heads * d))
        self.o_proj = row_parallel(cfg.q_size, h, bias, "num_attention_heads * head_dim")
        self.q_norm = Float32RMSNorm(d, cfg.rms_norm_eps, offset=1.0)
        self.k_norm = Float32RMSNorm(d, cfg.rms_norm_eps, offset=1.0)
        self.rotary = rotary  # its tables turn the leading rotary_dim dimensions of a head
        self.attn = Attention(self.heads, kv_heads, d)
        # q/k/v as one matmul when served on the GPU (layers/decoder.py ``pack_projections``): this rank's
        # rows of each, so the packed shard stays [this rank's (query, gate) heads | its kv heads' k | v]. The
        # CPU keeps three matmuls, the reference's bits (a CPU BLAS may round a block of a wider matmul
        # differently).
        self.qkv: PackedProjection | None = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.qkv is not None and x.is_cuda:
            q_gate, k, v = self.qkv(x)  # views of one matmul: [n, 2 * q_size], [n, kv_size] twice
        else:
            q_gate, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(self.attend(positions, q_gate, k, v))

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``attend_fused`` and a fused o_proj serve the stream h [n, hidden] (``block_fuses``)."""
        return block_fuses(h, self.qkv, self.o_proj)

    def attend_fused(self, positions: torch.Tensor, rows, eps: float) -> torch.Tensor:
        """The fused path's attention (``fuses``): rows, the stream made ready for the input norm of eps
        ``eps``, -> the gated attention output [n, heads * head_dim] before o_proj. The packed q/k/v (each
        query head beside its gate head) read the stream through the norm-folding kernel; where the
        attention reads the cache the kernels write, one more launch does the heads (the (1 + w) head norms,
        the partial RoPE, the cache write) and the attention applies the gate as it stores its output
        (layers/fused_sandwich.py ``attend_fused_qkv_gate``; an fp8 weight's quantized product folding the norm
        into its store), else ``attend`` does."""
        weight, d = self.qkv.weight, self.head_dim
        if d & (d - 1) or self.attn.fused_write_target() is None:
            q_gate, k, v = project_normalised(rows, eps, weight).split(self.qkv.sizes, dim=-1)
            return self.attend(positions, q_gate, k, v)
        q_size = self.qkv.sizes[0] // 2
        return attend_fused_qkv_gate(
            self, positions, kernel_rows(rows), eps, weight, q_size, q_size, interleaved=True
        )

    def attend(
        self, positions: torch.Tensor, q_gate: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q_gate [n, 2 * q_size] (per head [query, gate]), k, v [n, kv_size] -> the attention output
        gated by sigmoid(gate), [n, heads * head_dim] (before o_proj)."""
        n, d = q_gate.shape[0], self.head_dim
        q, gate = q_gate.view(n, self.heads, 2 * d).chunk(2, dim=-1)  # [n, heads, head_dim] each
        q = self.q_norm(q)
        k = self.k_norm(k.view(n, -1, d))  # [n, kv_heads, head_dim]
        v = v.view(n, -1, d)
        q, k = self.rotary(positions, q, k)  # partial: the dimensions past rotary_dim pass through
        out = self.attn(q, k, v, positions)  # [n, heads * head_dim]
        return sigmoid_gate(out.view(n, self.heads, d), gate).view(n, -1)


class _FoldedInput(NamedTuple):
    """What ``FusedInputGatedDeltaNet._in_projected`` projects on the fused path: the stream made ready
    for the layer's input norm (``NormedRows`` or ``NormalisedRows``) and that norm's eps."""

    rows: object
    eps: float


class FusedInputGatedDeltaNet(GatedDeltaNet):
    """Gated DeltaNet whose few-row step (layers/deltanet_step_kernel.py) can also read its packed
    in-projections from the norm-folding kernel (``step_fused``), for the stack's fused path (module
    docstring); its eager path is ``GatedDeltaNet``'s."""

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``step_fused`` and a fused out_proj serve the stream h [n, hidden]: each input projection
        (``_input_projections``) and out_proj fused (``block_fuses``), and the step kernel taking this forward."""
        return all(
            block_fuses(h, p, self.out_proj) for p in self._input_projections()
        ) and self._takes_fused_step(h)

    def _input_projections(self) -> list:
        """The projections the fused path reads the stream through: the packed in-projections, and each of
        those it does not pack (a checkpoint storing them in two formats: Qwen3-Next-FP8 keeps in_proj_ba in
        bf16 beside its fp8 in_proj_qkvz), one norm-folding launch each, but b and a's where the step kernel
        projects them itself (``_projected_rows``)."""
        return ([self.in_proj] if self.in_proj is not None else []) + self.unpacked_projections()

    def _b_and_a(self) -> list[nn.Module]:
        """b and a's projections: Qwen3-Next's one, packed by key head, or Qwen3.5's two."""
        return [self.in_proj_ba] if self.packed_by_key_head else [self.in_proj_b, self.in_proj_a]

    def _projects_b_and_a_in_step(self, rows) -> bool:
        """Whether the step kernel projects b and a from the rows (layers/deltanet_step_kernel.py: B AND A FROM
        THE ROWS) rather than a launch of their own: b and a's projections not packed with the others (two
        formats), stored unquantized, contiguous, in the rows' dtype."""
        read = kernel_rows(rows)  # NormedRows as they are, or the normalised input
        x = read.normed if read is rows else read
        unpacked = self.unpacked_projections()
        return all(
            any(p is q for q in unpacked)
            and not is_quantized(p)
            and p.weight.dtype == x.dtype
            and p.weight.is_contiguous()
            for p in self._b_and_a()
        )

    def _projected_rows(self, x):
        """``GatedDeltaNet._projected_rows``; of a ``_FoldedInput`` whose b and a the step kernel projects
        (``_projects_b_and_a_in_step``), the other in-projections by the norm-folding kernels, and b and a's
        weights with the rows they multiply (``BaRows``)."""
        if not (isinstance(x, _FoldedInput) and self._projects_b_and_a_in_step(x.rows)):
            return super()._projected_rows(x)
        from outpace.layers.deltanet_step_kernel import BaRows  # (Triton: only when used)

        in_step = self._b_and_a()
        projected = self._packed_normalised(x) + tuple(
            p.weight
            if any(p is q for q in in_step)
            else project_normalised(x.rows, x.eps, fused_weight(p))
            for p in self.unpacked_projections()
        )
        read = kernel_rows(x.rows)  # NormedRows as they are, or the normalised input
        ba = (
            BaRows(read.normed, read.sq_parts, x.eps) if read is x.rows else BaRows(read, None, 0.0)
        )
        return dataclasses.replace(self._rows_of(projected), ba_rows=ba)

    def step_fused(self, rows, eps: float) -> torch.Tensor:
        """rows: the stream made ready for the layer's input norm of eps ``eps`` -> the step kernel's output
        [n, value_dim], before out_proj: ``GatedDeltaNet.step_kernel`` with the in-projections as one
        norm-folding kernel (``_in_projected``)."""
        return self.step_kernel(_FoldedInput(rows, eps))

    def _in_projected(self, x: torch.Tensor | _FoldedInput) -> tuple[torch.Tensor, ...]:
        """``GatedDeltaNet._in_projected``; of a ``_FoldedInput`` (``step_fused``), the in-projections of the
        normalised stream by the norm-folding kernels, one [n, out_i] per projection: views of one launch's
        output where they are packed, else a launch each (``_input_projections``)."""
        if not isinstance(x, _FoldedInput):
            return super()._in_projected(x)
        return self._packed_normalised(x) + tuple(
            project_normalised(x.rows, x.eps, fused_weight(p)) for p in self.unpacked_projections()
        )

    def _packed_normalised(self, x: _FoldedInput) -> tuple[torch.Tensor, ...]:
        """The packed in-projections of the normalised stream (``in_proj``: one norm-folding launch), one
        [n, out_i] view each; none without it."""
        if self.in_proj is None:
            return ()
        return project_normalised(x.rows, x.eps, fused_weight(self.in_proj)).split(
            self.in_proj.sizes, dim=-1
        )


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, hybrid: Qwen3NextConfig, rotary: RotaryEmbedding, index: int
    ) -> None:
        super().__init__()
        self.input_layernorm = Float32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)
        self.post_attention_layernorm = Float32RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, offset=1.0
        )
        self.is_linear = hybrid.layer_types[index] == "linear_attention"
        if self.is_linear:
            self.linear_attn = FusedInputGatedDeltaNet(
                cfg.hidden_size,
                hybrid.num_k_heads,
                hybrid.num_v_heads,
                hybrid.head_k_dim,
                hybrid.head_v_dim,
                hybrid.conv_width,
                cfg.rms_norm_eps,
                cfg.hidden_act,
                packed_by_key_head=cfg.architecture == NEXT,
            )
        else:
            self.self_attn = GatedAttention(cfg, hybrid, rotary)
        if index in hybrid.moe_layers:
            self.mlp = SparseMoeWithSharedExpert(
                cfg.hidden_size,
                hybrid.routing,
                hybrid.moe_intermediate_size,
                hybrid.shared_expert_intermediate_size,
                cfg.hidden_act,
            )
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> h + mixer + MLP, [num_tokens, hidden]."""
        return residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream h + residual in and out, as layers/decoder.py's ``pre_norm_residual``."""
        return pre_norm_residual(self, positions, h, residual, self.mix)

    def mix(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The token mixer over x [num_tokens, hidden] (normalised): linear or full attention."""
        return self.linear_attn(x) if self.is_linear else self.self_attn(positions, x)

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``forward_fused`` serves the stream h [num_tokens, hidden]: the mixer's fused path, and a
        dense MLP that ``mlp_fuses`` (a MoE reads its input materialised: ``forward_fused``)."""
        mixer = self.linear_attn if self.is_linear else self.self_attn
        return mixer.fuses(h) and (not isinstance(self.mlp, GatedMLP) or mlp_fuses(self.mlp))

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """rows: the layer's input stream made ready for its input norm (``NormedRows`` or ``NormalisedRows``)
        -> its output stream made ready for ``next_norm`` (module docstring): out_proj / o_proj adds the
        residual; a dense MLP folds the post-attention norm into gate/up and down_proj adds the residual; a
        MoE block as layers/fused_decoder.py ``moe_block_fused`` runs it."""
        eps, post = self.input_layernorm.eps, self.post_attention_layernorm
        if self.is_linear:
            out, out_proj = self.linear_attn.step_fused(rows, eps), self.linear_attn.out_proj
        else:
            out, out_proj = self.self_attn.attend_fused(positions, rows, eps), self.self_attn.o_proj
        if isinstance(self.mlp, GatedMLP):
            mid = project_add_ready(out, out_proj, rows.stream, post)  # (sharded: NormalisedRows)
            return mlp_fused(self.mlp, mid, post.eps, next_norm)
        takes_rows = self.mlp.takes_normed_rows(rows.stream)
        return moe_block_fused(
            out,
            out_proj,
            rows.stream,
            post,
            next_norm,
            self.mlp.partial,
            takes_rows,
            self.mlp.group,
        )


class Qwen3NextModel(nn.Module):
    def __init__(self, cfg: ModelConfig, hybrid: Qwen3NextConfig) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(
            hybrid.rotary_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
        )
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            Qwen3NextDecoderLayer(cfg, hybrid, self.rotary, i) for i in range(cfg.num_hidden_layers)
        )
        self.norm = Float32RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)


def _check_types(cfg: ConfigFields) -> None:
    """The family's own fields of the types Qwen3NextConfig reads them as, refused by name (file and field)
    otherwise: before, a string or a 0 there met a bare TypeError or ZeroDivisionError at build."""
    for name in (
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "full_attention_interval",
        "decoder_sparse_step",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "num_experts_per_tok",
    ):
        cfg.integer(name, None)
    cfg.integer("num_experts", None, minimum=0)
    cfg.number("partial_rotary_factor", None, positive=True)
    cfg.strings("layer_types")
    cfg.integers("mlp_only_layers")
    cfg.boolean("norm_topk_prob", True)
    cfg.boolean("attention_bias", False)


class Qwen3NextForCausalLM(nn.Module, ConfigHooks):
    # Sharded over tensor-parallel ranks when built inside distributed.group.building_in (module docstring).
    shards_over_ranks = True
    # Qwen3NextConfig's, Qwen3_5TextConfig's and Qwen3_5MoeTextConfig's (Qwen3_5TextConfig's num_key_value_heads
    # is 4: ``config_defaults``)
    class_defaults = {"max_position_embeddings": 32768, "head_dim": 256, "num_key_value_heads": 2}
    partial_rotary = True  # RoPE turns the leading partial_rotary_factor of each head

    @classmethod
    def config_defaults(cls, cfg: ConfigFields) -> dict:
        defaults, arch = dict(cls.class_defaults), (cfg.get("architectures") or [None])[0]
        if arch in QWEN35_DENSE:
            defaults["num_key_value_heads"] = 4
        if arch in QWEN35_MOE:
            # Qwen3_5MoeTextConfig's mixture (``DEFAULTS`` holds Qwen3NextConfig's 512 experts, 10 per token)
            defaults |= {"num_experts": 256, "num_experts_per_tok": 8}
        return {k: v for k, v in defaults.items() if k not in cfg}

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        _check_types(cfg)
        # Qwen3_5MoeTextConfig has no intermediate_size: no layer has a dense MLP (the MTP layers neither), so
        # ModelConfig's field holds the experts' width, which no module reads
        if cfg.get("model_type") == "qwen3_5_moe_text" and cfg.get("intermediate_size") is None:
            return {
                "intermediate_size": cfg.integer(
                    "moe_intermediate_size", DEFAULTS["moe_intermediate_size"]
                )
            }
        return {}

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        super().__init__()
        if mtp_own_heads:
            raise ConfigError(
                f"{cfg.architecture}: MTP layers in DeepSeek's layout are not implemented"
            )
        self.hybrid = Qwen3NextConfig.from_model_config(cfg)
        num_mtp = mtp_layer_count(cfg.raw)
        self.config = dataclasses.replace(cfg, num_nextn_predict_layers=num_mtp)
        self.model = Qwen3NextModel(cfg, self.hybrid)
        self.lm_head = LMHead(
            cfg.hidden_size,
            cfg.vocab_size,
            tied_to=self.model.embed_tokens if cfg.tie_word_embeddings else None,
        )
        self.aux_layer_ids: tuple[int, ...] = ()
        self.ignored_checkpoint_tensors = (r"\.rotary_emb\.inv_freq$",) + (
            () if num_mtp else (r"^mtp\.",)
        )
        if (
            num_mtp
        ):  # (registered before the steps, so parameters are named mtp.* as in the checkpoint)
            mtp_stack = dataclasses.replace(
                self.hybrid,
                layer_types=("full_attention",) * num_mtp,
                moe_layers=self.hybrid.mtp_moe_layers,
            )
            self.mtp = QwenMTP(
                cfg.hidden_size,
                cfg.rms_norm_eps,
                [
                    Qwen3NextDecoderLayer(cfg, mtp_stack, self.model.rotary, k)
                    for k in range(num_mtp)
                ],
            )
            self.mtp_layers = self.mtp.steps()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """input_ids, positions [num_tokens] -> the last layer's output, pre-norm, and the aux states. Few
        rows on the GPU: the fused path (module docstring) where every layer takes it."""
        layers, h = self.model.layers, self.embed(input_ids)
        norms = [layer.input_layernorm for layer in layers]
        h, captured = run_stack(layers, norms, self.model.norm, positions, h, self.aux_layer_ids)
        return self._model_output(h, captured)

    def compute_logits(
        self, hidden_states: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm -> [n, vocab] float32 logits (written into ``out`` if given)."""
        return norm_head_logits(self.model.norm, self.lm_head, hidden_states, out)

    def checkpoint_name(self, param_name: str) -> str:
        """The MTP steps' parameters (``mtp_layers.{k}.*``) under the checkpoint's ``mtp.*`` names; the model's
        own parameters are named as the checkpoint names them (``mtp`` registered before the steps)."""
        return step_checkpoint_name(param_name)

    # aux layer capture, the embedding and the greedy head as the Llama family's (models/llama.py)
    greedy_tokens = LlamaForCausalLM.greedy_tokens
    set_aux_hidden_state_layers = LlamaForCausalLM.set_aux_hidden_state_layers
    embed = LlamaForCausalLM.embed
    _model_output = LlamaForCausalLM._model_output


class Qwen35TextForCausalLM(TextOfMultimodal, Qwen3NextForCausalLM):
    """The text model of the hub's Qwen3.5 checkpoints, which are multimodal (Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration): the decoder under ``model.language_model.``, the head and the MTP layers
    at the top level as in the text model's own checkpoint, the vision tower (``model.visual``) skipped."""

    TOWERS = ("model.visual",)
