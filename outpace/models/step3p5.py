"""Step-3.5-Flash: Step3p5ForCausalLM (stepfun-ai/Step-3.5-Flash). transformers has no class for it; every
fact below is read from the public serving code that loads its checkpoints, vLLM
(vllm/model_executor/models/step3p5.py, step3p5_mtp.py, transformers_utils/configs/step3p5.py) and SGLang
(python/sglang/srt/models/step3p5.py), and where the two disagree the value is refused by name.

A decoder layer (vLLM Step3p5DecoderLayer, SGLang Step3p5DecoderLayer) is pre-norm:
``h + attention(input_layernorm(h))``, then ``+ ffn(post_attention_layernorm(.))``, with
- every RMSNorm zero-centred, the scale ``1 + weight`` in float32 (both use GemmaRMSNorm: the input, post
  attention, final, per-head q/k and the MTP norms);
- attention by layer type (``layer_types[i]``): ``sliding_attention`` layers attend over the last
  ``sliding_window`` keys with ``attention_other_setting``'s head counts, ``full_attention`` layers over
  every key with ``num_attention_heads`` / ``num_attention_groups``; scale head_dim ** -0.5;
- per-head q/k norms, then RoPE in the neox layout over the first ``head_dim * partial_rotary_factors[i]``
  dimensions of each head, base ``rope_theta[i]``, scaled by ``rope_scaling`` only on the layer types named
  in ``yarn_only_types`` (a llama3 scaling in the released config, despite the name);
- with ``use_head_wise_attn_gate`` each head's attention output times sigmoid(``g_proj(x)``), one gate value
  per head (g_proj: hidden -> heads), before ``o_proj``;
- the layers listed in ``moe_layers_enum`` are MoE, the others a dense SwiGLU MLP (``mlp.*``). MoE: the
  sigmoid of float32 router logits (``moe.gate``), ``moe.router_bias`` added to choose the top
  ``moe_top_k`` experts only, the chosen scores renormalised and times ``moe_router_scaling_factor``; the
  routed experts stored stacked (``moe.{gate,up,down}_proj.weight`` [experts, out, in]: vLLM's "packed 3D
  format", SGLang's loader reads ``loaded_weight[expert_id]``), plus one shared expert
  (``share_expert.*``, ``share_expert_dim`` wide) on every token;
- SwiGLU clamps (vLLM SwigluStepAndMul, SGLang Step3p5MLP): where a layer's limit L is non-zero,
  ``silu(gate).clamp(max=L) * up.clamp(-L, L)``; ``swiglu_limits[i]`` for the routed experts,
  ``swiglu_limits_shared[i]`` for the shared expert and the dense MLP.
The embedding is plain, the head untied (SGLang sets tie_word_embeddings False, vLLM never ties).

Sliding window: vLLM's per_layer_sliding_window (and transformers' Mistral convention) lets a query at p
see the keys p - W + 1 .. p; SGLang hands ``sliding_window`` to RadixAttention as the number of keys to
the left (its Gemma models pass sliding_window - 1 for that reason), one key more. We follow vLLM.

MTP (vLLM step3p5_mtp.py Step3p5AMultiTokenPredictorLayer): ``num_nextn_predict_layers`` layers at
``model.layers.{num_hidden_layers + k}``, each ``eh_proj(concat(enorm(embed(t+1)), hnorm(h_t)))`` then a
full decoder layer of that index (its own layer type, theta, MoE or dense by the per-layer lists, which
run num_hidden_layers + num_nextn_predict_layers long), then its own head:
``transformer.shared_head.output(transformer.shared_head.norm(.))``. The embedding is the target's
(vLLM maps every ``embed_tokens`` tensor to one shared embedding); the state read is the target's last
hidden state before the final norm (vLLM's Step3p5Model returns it un-normed, SGLang hands on
hidden_states_before_norm); no position-0 masking. The layers chain: layer k reads layer k - 1's output
(models/drafts/mtp.py; speculative/drafters/mtp.py).

Few rows on the GPU (decode, verify) run the stack in the fused residual style of Qwen3-Next's layers
(layers/fused_decoder.py ``run_stack``; ``Step3p5DecoderLayer.forward_fused``): q/k/v and the head-wise gate read
the stream through the input norm, the attention kernels apply the gate as they store their output
(attention/triton_kernels.py ``out_gate``), o_proj and down_proj add the residual and ready the next norm, and a MoE
block runs as layers/fused_decoder.py ``moe_block_fused``: on one GPU its routing and gate/up fold the
post-attention norm in and its combine readies the next norm; under tensor parallelism its output (this rank's
partial sum) is all-reduced, added and normalised for the next layer in one launch where the symmetric
all-reduce serves. Block FP8 q/k/v keep the eager residual stack, with attention on its fused kernels.

Tensor parallelism (outpace/distributed/), as vLLM and SGLang shard it: each layer's heads split by its own
type's counts (layers/decoder.py ``HeadProjections``: q/k/v column-parallel by head, kv heads replicated
when fewer than ranks, o row-parallel), the per-head gate rows ``g_proj`` split with their heads; the MoE as
layers/moe.py's default TP MoE: every rank holds moe_intermediate_size / size rows of every stacked expert's
gate/up (and the matching columns of down) and share_expert_dim / size of the shared expert's, the routed
plus shared partial sums all-reduced once; the dense MLP column/row-parallel; vocab-parallel embedding,
head and each MTP layer's shared head.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import build_group
from outpace.distributed.sharding import Shard, mark_shard, split_evenly
from outpace.layers import fused_decoder
from outpace.layers.activation import sigmoid_gate, silu_and_mul
from outpace.layers.decoder import (
    GatedMLP,
    HeadProjections,
    PackedProjection,
    pre_norm_residual,
    residual_stream,
)
from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.fused_sandwich import attend_fused_qkv, attend_fused_qkv_gate
from outpace.layers.linear import column_parallel
from outpace.layers.moe import (
    ExpertActivation,
    ReadyStream,
    RoutedExperts,
    RowNorm,
    expert_rows_group,
    moe_on_kernels,
    takes_normed_rows,
)
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.int4_weight import Int4Weight
from outpace.layers.rotary import RotaryEmbedding
from outpace.layers.router import Router
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import ConfigHooks
from outpace.models.drafts.mtp import MTPBlock
from outpace.models.gemma import final_logits
from outpace.models.llama import LlamaForCausalLM, ModelOutput
from outpace.models.step3p5_config import DEFAULTS, LayerSpec, Step3p5Config, refuse
from outpace.validation import ConfigFields, is_finite_number


def zero_centred_norm(dim: int, eps: float) -> Float32RMSNorm:
    """GemmaRMSNorm (vLLM, SGLang): normalised in float32 and scaled by 1 + weight."""
    return Float32RMSNorm(dim, eps, offset=1.0)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """silu(gate) * up, or with a limit silu(gate).clamp(max=limit) * up.clamp(-limit, limit): [..., inter]."""
    if limit is None:
        return silu_and_mul(gate, up)
    return torch.nn.functional.silu(gate).clamp(max=limit) * up.clamp(-limit, limit)


class Step3p5MLP(GatedMLP):
    """The dense MLP and the shared expert: a SiLU ``GatedMLP`` with the optional SwiGLU clamp."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        limit: float | None,
        reduce: bool = True,
        what: str = "intermediate_size",
    ) -> None:
        """``reduce=False``: this rank's partial sum (the shared expert, all-reduced with the routed experts)."""
        super().__init__(hidden_size, intermediate_size, "silu", reduce=reduce, what=what)
        self.limit = limit

    @property
    def gating_fuses(self) -> bool:
        return self.limit is None

    def gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return clamped_swiglu(gate, up, self.limit)


class Step3p5MoE(RoutedExperts):
    """The router and the stacked routed experts (checkpoint: ``moe.gate.weight``, ``moe.router_bias``,
    ``moe.{gate,up,down}_proj.weight``); [n, hidden] -> [n, hidden]. The shared expert is the layer's.
    The checkpoint keeps the router beside the expert stacks, so this is the ``RoutedExperts`` (separate
    stacks, SiLU with the routed experts' clamp: ``clamped_swiglu``) with the router added: forward(x)
    routes, then runs the experts (``run``), plus the layer's shared expert when handed it.

    The routing is DeepSeek-V3's without groups (``Step3p5Config.routing``: sigmoid scores, router_bias
    added to choose only, the chosen scores renormalised and times moe_router_scaling_factor), so on CUDA
    the block is layers/moe.py ``moe_on_kernels``: the routing kernel writing the grouped kernels' block
    layout, the grouped experts, and the shared expert fused as more experts of weight 1 where it can be
    (``shared_expert_stacks``: share_expert_dim a multiple of moe_intermediate_size, and its clamp from
    swiglu_limits_shared the routed experts' from swiglu_limits), else added after them.

    Sharded: this rank's moe_intermediate_size / size rows of every expert's gate and up stacks and the
    matching columns of down; the output is this rank's partial sum (the layer all-reduces it)."""

    def __init__(self, cfg: Step3p5Config, limit: float | None) -> None:
        group, e, h, full = (
            expert_rows_group(),  # (the tensor-parallel group, or one rank under expert parallelism)
            cfg.routing.num_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        )
        inter = split_evenly(full, group.size, "moe_intermediate_size")
        super().__init__(ExpertActivation("silu", limit=limit), stacked=(e, h, inter), packed=False)
        if group.size > 1:
            first = group.rank * inter
            mark_shard(self.gate_proj.weight, Shard(1, first, inter, full))
            mark_shard(self.up_proj.weight, Shard(1, first, inter, full))
            mark_shard(self.down_proj.weight, Shard(2, first, inter, full))
        self.gate = Router(h, cfg.routing)

    def forward(
        self,
        x: torch.Tensor,
        shared_mlp: nn.Module | None = None,
        ready: ReadyStream | None = None,
        row_norm: RowNorm | None = None,
    ):
        """x [n, hidden] -> this rank's routed output [n, hidden], plus ``shared_mlp``'s when given; with
        ``ready`` added to a stream and made ready for the next norm (``NormedRows``); with ``row_norm`` x
        is a stream times the norm's weight (layers/moe.py ``takes_normed_rows``)."""
        if self.uses_kernels(x):
            return moe_on_kernels(x, self.gate, self, shared_mlp, ready=ready, row_norm=row_norm)
        out = self.run(x, *self.gate(x))  # weights, ids [n, top_k]
        out = out if shared_mlp is None else out + shared_mlp(x)
        return out if ready is None else ready.add(out)


class Step3p5Attention(nn.Module):
    def __init__(self, cfg: Step3p5Config, spec: LayerSpec, rotary: RotaryEmbedding) -> None:
        super().__init__()
        h, d, group = cfg.hidden_size, cfg.head_dim, build_group()
        self.head_dim = d
        # heads split over tensor-parallel ranks by this layer type's counts (layers/decoder.py), refused under
        # the config field they come from when they do not split
        sliding = spec.sliding_window is not None
        split_evenly(
            spec.num_heads,
            group.size,
            "attention_other_setting.num_attention_heads" if sliding else "num_attention_heads",
        )
        p = HeadProjections(h, h, spec.num_heads, spec.num_kv_heads, d, False, False)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p.q_proj, p.k_proj, p.v_proj, p.o_proj
        self.q_norm = zero_centred_norm(d, cfg.rms_norm_eps)
        self.k_norm = zero_centred_norm(d, cfg.rms_norm_eps)
        # one gate row per head: this rank's heads' rows
        self.g_proj = (
            column_parallel(h, spec.num_heads, False, (group.rank * p.heads, p.heads))
            if cfg.head_wise_gate
            else None
        )
        self.rotary = rotary  # its tables turn the leading rotary_dim dimensions of a head
        self.attn = Attention(p.heads, p.kv_heads, d, spec.sliding_window)
        # q/k/v (and g) as one matmul when served on the GPU (layers/decoder.py ``pack_projections``): this
        # rank's rows of each, so the packed shard stays [its heads' q | its kv heads' k | v | its heads'
        # gates]. The CPU keeps the separate matmuls, the reference's bits (MKL rounds g's few rows
        # differently alone than inside the packed matmul).
        self.in_proj: PackedProjection | None = None

    def in_projections(self) -> list[nn.Module]:
        """The projections of x, in the order ``in_proj`` packs them: q, k, v, and g with the head-wise gate
        where it is stored as they are (Step-3.5-Flash-FP8 keeps g_proj in bf16 beside fp8 q/k/v: then g
        stays a projection of its own)."""
        qkv = [self.q_proj, self.k_proj, self.v_proj]
        return qkv + ([self.g_proj] if self._packs_gate() else [])

    def _packs_gate(self) -> bool:
        return self.g_proj is not None and type(self.g_proj) is type(self.q_proj)

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether ``attend_rows`` serves x [num_tokens, hidden] (normalised): q/k/v packed without bias
        (``in_proj``'s leading rows; half precision or block FP8), neox RoPE over a power-of-two head_dim
        (whole heads in the sliding layers, half of each in the full-attention ones: the per-head kernel
        turns either), few rows on the GPU (layers/fused_decoder.py ``fusable_qkv``) and a backend that
        attends over a cache the kernel wrote."""
        d = self.head_dim
        return (
            self.in_proj is not None
            and self.in_proj.bias is None
            and not self.rotary.interleaved
            and d & (d - 1) == 0
            and fused_decoder.fusable_qkv(x, self.in_proj.weight)
            and self.attn.fused_write_target() is not None
        )

    def reads_rows(self) -> bool:
        """Whether ``attend_rows`` takes the stream made ready for the input norm (``NormedRows`` or
        ``NormalisedRows``), every projection of x folding the norm in: q/k/v (half precision, or block FP8
        through the quantized product and the per-head kernel), and the gate packed with them or stored apart
        without a bias in a format the fused kernels read (Step-3.5-Flash-FP8's bf16 g_proj: a norm-folding
        launch of its own)."""
        gate = self.g_proj
        return (
            gate is None
            or self._packs_gate()
            or (gate.bias is None and fused_decoder.fused_weight(gate) is not None)
        )

    def attend_rows(self, positions: torch.Tensor, rows, eps: float) -> torch.Tensor:
        """The attention output before o_proj [num_tokens, heads * head_dim] over rows: x normalised
        [num_tokens, hidden], or (``reads_rows``) the stream made ready for the input norm of eps ``eps``.
        One projection kernel for q/k/v and the head-wise gate packed in half precision, then the per-head
        kernel (zero-centred head norms, RoPE, the cache write), then attention storing its output gated
        (layers/fused_sandwich.py ``attend_fused_qkv_gate``; in block FP8 the quantized product, which folds
        the input norm into its store). A gate stored apart (Step-3.5-Flash-FP8's bf16 g_proj) is projected in
        a launch of its own, then applied by the attention's launch as well (``attend_fused_qkv``'s
        ``out_gate``)."""
        sizes = self.in_proj.sizes
        weight = (
            self.in_proj.weight
        )  # [q | k | v (| g)] rows, contiguous (or an Fp8Weight / Int4Weight of them)
        quantized = isinstance(weight, (Fp8Weight, Int4Weight))
        kernel_rows = fused_decoder.kernel_rows(rows)
        if self.g_proj is not None and self._packs_gate():
            return attend_fused_qkv_gate(
                self, positions, kernel_rows, eps, weight, sizes[0], sizes[3]
            )  # [num_tokens, heads * head_dim]
        qkv_rows = sum(sizes[:3])
        qkv = weight.rows(0, qkv_rows) if quantized else weight[:qkv_rows]
        gate = None  # [num_tokens, heads]: one logit per head
        if self.g_proj is not None and isinstance(rows, torch.Tensor):  # x normalised
            gate = weight.rows(qkv_rows).project(rows) if self._packs_gate() else self.g_proj(rows)
        elif self.g_proj is not None:  # (reads_rows) the norm folded into the gate's launch
            g_weight = (
                weight.rows(qkv_rows)
                if self._packs_gate()
                else fused_decoder.fused_weight(self.g_proj)
            )
            gate = fused_decoder.project_normalised(rows, eps, g_weight)
        return attend_fused_qkv(
            self, positions, kernel_rows, eps, qkv=(qkv, sizes[0]), out_gate=gate
        )  # [num_tokens, heads * head_dim]

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """positions [num_tokens]; x [num_tokens, hidden] -> [num_tokens, hidden]."""
        if self.fuses(x):
            return self.o_proj(self.attend_rows(positions, x, 0.0))
        n, d = x.shape[0], self.head_dim
        if self.in_proj is not None and x.is_cuda:
            q, k, v, *g = self.in_proj(x)  # views of one matmul
        else:
            q, k, v, *g = (p(x) for p in self.in_projections())
        if self.g_proj is not None and not g:  # (a gate stored unlike q/k/v)
            g = [self.g_proj(x)]
        q = self.q_norm(q.view(n, -1, d))  # [num_tokens, heads, head_dim]
        k = self.k_norm(k.view(n, -1, d))  # [num_tokens, kv_heads, head_dim]
        v = v.view(n, -1, d)
        q, k = self.rotary(positions, q, k)  # partial: the dimensions past rotary_dim pass through
        out = self.attn(q, k, v, positions)  # [num_tokens, heads * head_dim]
        if g:  # one sigmoid gate per head: g[0] [num_tokens, heads]
            out = sigmoid_gate(out.view(n, -1, d), g[0][..., None]).view(n, -1)
        return self.o_proj(out)


class Step3p5DecoderLayer(nn.Module):
    def __init__(self, cfg: Step3p5Config, index: int, rotary: RotaryEmbedding) -> None:
        """``index``: the layer's index in the checkpoint (MTP layers after the decoder stack)."""
        super().__init__()
        spec = cfg.layers[index]
        self.input_layernorm = zero_centred_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Step3p5Attention(cfg, spec, rotary)
        self.post_attention_layernorm = zero_centred_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.is_moe = spec.moe
        if spec.moe:
            self.moe = Step3p5MoE(cfg, spec.swiglu_limit)
            self.share_expert = Step3p5MLP(
                cfg.hidden_size,
                cfg.share_expert_dim,
                spec.swiglu_limit_shared,
                reduce=False,
                what="share_expert_dim",
            )
            self.group = build_group()  # the routed and shared partial sums are all-reduced once
        else:
            self.mlp = Step3p5MLP(cfg.hidden_size, cfg.intermediate_size, spec.swiglu_limit_shared)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> the layer's output [num_tokens, hidden]."""
        return residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream h + residual in and out, as layers/decoder.py's ``pre_norm_residual``."""
        return pre_norm_residual(self, positions, h, residual, feed_forward=self.feed_forward)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The dense MLP, or the routed and shared experts, over x [num_tokens, hidden] (normalised)."""
        if not self.is_moe:
            return self.mlp(x)
        return all_reduce(self.moe(x, self.share_expert), self.group)

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``forward_fused`` serves the stream h [num_tokens, hidden]: the attention's fused path
        reading the stream through the norm (``reads_rows``), its o_proj adding the residual
        (layers/fused_decoder.py ``block_fuses``), and a dense MLP that ``mlp_fuses`` (any MoE block:
        ``moe_block_fused``)."""
        attn = self.self_attn
        return (
            attn.fuses(h)
            and attn.reads_rows()
            and fused_decoder.block_fuses(h, attn.in_proj, attn.o_proj)
            and (self.is_moe or fused_decoder.mlp_fuses(self.mlp))
        )

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """rows: the layer's input stream made ready for its input norm (``NormedRows`` or ``NormalisedRows``)
        -> its output stream made ready for ``next_norm``, as Qwen3-Next's layers (models/qwen3_next.py):
        o_proj adds the residual; a dense MLP folds the post-attention norm into gate/up (its SwiGLU clamp,
        where it has one, a launch between) and down_proj adds the residual; the experts and the shared
        expert as layers/fused_decoder.py ``moe_block_fused`` runs a MoE block (on one GPU the post-attention
        norm folded into routing and gate/up, the next norm readied by their combine)."""
        attn, post = self.self_attn, self.post_attention_layernorm
        out = attn.attend_rows(positions, rows, self.input_layernorm.eps)
        if not self.is_moe:
            mlp = self.mlp
            mid = fused_decoder.project_add_ready(out, attn.o_proj, rows.stream, post)
            return fused_decoder.mlp_fused(mlp, mid, post.eps, next_norm)
        moe, shared = self.moe, self.share_expert
        return fused_decoder.moe_block_fused(
            out,
            attn.o_proj,
            rows.stream,
            post,
            next_norm,
            lambda x, ready, row_norm: moe(x, shared, ready, row_norm),
            takes_normed_rows(moe.gate, moe, shared, rows.stream),
            self.group,
        )


class Step3p5SharedHead(nn.Module):
    """An MTP layer's own head (checkpoint: ``transformer.shared_head.{norm,output}``)."""

    def __init__(self, cfg: Step3p5Config) -> None:
        super().__init__()
        self.norm = zero_centred_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = LMHead(cfg.hidden_size, cfg.vocab_size)


class Step3p5MTPLayer(MTPBlock, Step3p5DecoderLayer):
    """An MTP layer: zero-centred enorm/hnorm and eh_proj (models/drafts/mtp.py), a Step-3.5 decoder layer, its own
    shared head; the target's embedding and pre-norm state (module docstring)."""

    chained_by_layout = True

    def __init__(self, cfg: Step3p5Config, index: int, rotary: RotaryEmbedding) -> None:
        super().__init__(cfg, index, rotary)
        self.shared_head = Step3p5SharedHead(cfg)

    def input_norm(self, cfg: Step3p5Config) -> nn.Module:
        return zero_centred_norm(cfg.hidden_size, cfg.rms_norm_eps)

    def head_norm(self) -> nn.Module:
        return self.shared_head.norm

    def head_parts(self, target: nn.Module) -> tuple[nn.Module | None, nn.Module]:
        return self.shared_head.norm, self.shared_head.head


class Step3p5Model(nn.Module):
    def __init__(self, cfg: Step3p5Config) -> None:
        super().__init__()
        # One rotary table per distinct (rotated dims, theta, scaling), shared by the layers using it
        # (not checkpoint tensors).
        tables: dict[tuple, int] = {}
        rotaries, self.rotary_index = [], []  # rotary_index: per layer, MTP layers included
        for spec in cfg.layers:
            key = (spec.rotary_dim, spec.rope_theta, repr(spec.rope_scaling))
            if key not in tables:
                tables[key] = len(rotaries)
                rotaries.append(
                    RotaryEmbedding(
                        spec.rotary_dim,
                        cfg.max_position_embeddings,
                        spec.rope_theta,
                        spec.rope_scaling,
                    )
                )
            self.rotary_index.append(tables[key])
        self.rotaries = nn.ModuleList(rotaries)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            Step3p5DecoderLayer(cfg, i, self.rotary(i)) for i in range(cfg.num_hidden_layers)
        )
        self.norm = zero_centred_norm(cfg.hidden_size, cfg.rms_norm_eps)

    def rotary(self, index: int) -> RotaryEmbedding:
        return self.rotaries[self.rotary_index[index]]


class Step3p5ForCausalLM(nn.Module, ConfigHooks):
    ignored_checkpoint_tensors = (r"\.rotary_emb\.inv_freq$",)
    # Sharded over tensor-parallel ranks when built inside distributed.group.building_in (module docstring).
    shards_over_ranks = True
    # vLLM's Step3p5Config's (the source of step3p5_config.py's ``DEFAULTS``; transformers has no such class)
    class_defaults = {"rms_norm_eps": 1e-5}

    @classmethod
    def config_defaults(cls, cfg: ConfigFields) -> dict:
        defaults = super().config_defaults(cfg)
        if cfg.get("num_key_value_heads") is None and "num_attention_groups" not in cfg:
            defaults["num_attention_groups"] = 8  # (Step3p5Config's; its name for the kv heads)
        return defaults

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        own = {}
        if cfg.get("num_key_value_heads") is None and cfg.get("num_attention_groups") is not None:
            # its name for the kv heads (vLLM step3p5.py)
            own["num_key_value_heads"] = cfg.integer("num_attention_groups")
        theta = cfg.get("rope_theta")
        # absent: Step3p5Config's default, not ModelConfig's (a draft trained for this target copies it)
        if theta is None:
            own["rope_theta"] = DEFAULTS["rope_theta"]
        elif isinstance(theta, list):  # one theta per layer: Step3p5Config reads them all
            if not (theta and all(is_finite_number(t) and t > 0 for t in theta)):
                raise cfg.fail("rope_theta", theta, "a number > 0 or a list of them, one per layer")
            own["rope_theta"] = float(theta[0])
        return own

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # its windows are its layer specs' (step3p5_config.py _layer_spec: layer_types over the MTP layers too,
        # which ModelConfig.layer_windows does not cover), not the hook's
        return ()

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        """``mtp_own_heads`` (the loader's DeepSeek-V3 layout test) is False for Step-3.5 checkpoints, whose MTP
        heads sit under ``transformer.shared_head``."""
        super().__init__()
        if mtp_own_heads:
            raise refuse(
                "num_nextn_predict_layers",
                cfg.num_nextn_predict_layers,
                "MTP layers in Step-3.5's layout (transformer.shared_head.*), not DeepSeek-V3's",
            )
        step = self.step_config = Step3p5Config.from_model_config(cfg)
        self.config = cfg
        self.model = Step3p5Model(step)
        self.lm_head = LMHead(step.hidden_size, step.vocab_size)
        self.aux_layer_ids: tuple[int, ...] = ()
        if cfg.num_nextn_predict_layers:
            n = step.num_hidden_layers
            self.mtp_layers = nn.ModuleList(
                Step3p5MTPLayer(step, n + k, self.model.rotary(n + k))
                for k in range(cfg.num_nextn_predict_layers)
            )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """input_ids, positions [num_tokens] -> the last layer's output [num_tokens, hidden], before the final norm."""
        layers = self.model.layers
        norms = [layer.input_layernorm for layer in layers]
        h, captured = fused_decoder.run_stack(
            layers, norms, self.model.norm, positions, self.embed(input_ids), self.aux_layer_ids
        )
        return self._model_output(h, captured)

    def compute_logits(
        self, hidden_states: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm -> [n, vocab] float32 logits (into ``out`` when given). Not the fused few-row
        kernel: it applies a plain RMSNorm weight, this norm is zero-centred."""
        return final_logits(self.lm_head(self.model.norm(hidden_states)), None, out)

    # Aux capture (index i: the input of layer i) and the embedding as the Llama family's.
    set_aux_hidden_state_layers = LlamaForCausalLM.set_aux_hidden_state_layers
    embed = LlamaForCausalLM.embed
    _model_output = LlamaForCausalLM._model_output

    def checkpoint_name(self, param_name: str) -> str:
        """Parameter name -> the Step-3.5 checkpoint's: MTP layers at model.layers.{num_hidden_layers + k} with
        their heads under ``transformer.shared_head`` (``output`` for the head), the router's correction bias
        as ``moe.router_bias`` (vLLM step3p5_mtp.py load_weights, SGLang Step3p5MoEMLP)."""
        name = param_name.replace("moe.gate.e_score_correction_bias", "moe.router_bias")
        m = re.match(r"mtp_layers\.(\d+)\.(.*)", name)
        if not m:
            return name
        rest = m.group(2)
        if rest.startswith("shared_head."):
            rest = "transformer." + rest.replace("shared_head.head.", "shared_head.output.")
        return f"model.layers.{self.config.num_hidden_layers + int(m.group(1))}.{rest}"
