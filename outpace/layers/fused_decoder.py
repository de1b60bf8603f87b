"""The few-row fast paths of every family's decoder layers, and the choice between them and the eager
modules (layers/decoder.py). On the GPU, for few half-precision rows (``fusable_rows``: decode and small
verify batches), a layer runs as a handful of projection kernels (layers/fused_projection.py: the norms,
RoPE, the KV write, the residual adds and the gate activation folded into the projections) around the
attention kernel; otherwise the eager modules run. Models stay eager code and call, where a fast path
exists:

- Llama-family layers: ``FusedDecoderLayer`` (the layer), ``run_layers`` (a stack: each layer hands
  the next its output stream already made ready for the next input norm), ``write_kv`` (DFlash's
  context rows);
- EAGLE3's layer over [embedding | hidden]: ``embed_norm_pair``, ``attention_and_mlp``;
- the final norm and LM head: ``norm_head_logits``;
- Gemma's "sandwich" layers: layers/fused_sandwich.py, from the pieces here;
- the hybrid stacks' blocks (models/qwen3_next.py, models/nemotron_h.py): ``run_fused_layers`` over blocks
  whose input projection reads the stream through the norm-folding kernels (``project_normalised``) and
  whose last projection adds the residual (``project_add_ready``); a block that must materialise its
  normalised input (a sparse MoE's router and experts read it) hands on ``NormalisedRows``.

Tensor parallelism: the fused kernels read a rank's shard as they read a whole weight (q/k/v, gate/up and the
in-projections are column-parallel: the rank's heads and rows). A row-parallel output projection (o_proj,
down_proj, out_proj) cannot add the residual before its partial sums are reduced, so there the block ends in
two launches: the plain projection, then the all-reduce, the residual add and the next norm
(``reduce_add_normalised``: one launch where layers/all_reduce_norm.py serves them), which hands the next block
its input normalised (``NormalisedRows``). In
batch-invariant mode these paths serve any number of rows (``fusable_rows``): the kernels tile the rows
and choose their tiles from N and K only (layers/fused_projection.py), so a row gets the same bits decoded
alone as verified among many, and the mode costs what the normal decode path costs. Their rounding
differs from the eager chain's, so in that mode every forward of a model takes one path or the other
whatever its row count.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import torch
from torch import nn

from outpace.attention.context import batch_invariant
from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import RankGroup
from outpace.layers.activation import FUSED_ACTIVATIONS, act_and_mul
from outpace.layers.argmax import argmax_last
from outpace.layers.decoder import (
    DecoderAttention,
    DecoderLayer,
    GatedMLP,
    residual_stream,
    run_residual_stack,
)
from outpace.layers.linear import is_sharded
from outpace.layers.moe import ReadyStream, RowNorm
from outpace.layers.norm import RMSNorm
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.int4_weight import Int4Weight
from outpace.layers.quant.linear import QuantizedLinear


def projection_kernels() -> ModuleType:
    """layers/fused_projection.py, imported on first use: every path here reaches it only after
    ``fusable_rows`` (CUDA tensors, or tests that force the kernels into Triton's interpreter)."""
    from outpace.layers import fused_projection  # lazy: it imports Triton, a GPU-only dependency

    return fused_projection


def row_norm_kernels() -> ModuleType:
    """layers/normed_rows.py (the norm kernels of one program a row beside the projections), imported on first
    use as ``projection_kernels``."""
    from outpace.layers import normed_rows  # lazy: it imports Triton

    return normed_rows


def fusable_rows(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernels (layers/fused_projection.py) serve x [n, in] @ weight.T: few rows, or
    any number in batch-invariant mode (``fused_rows_apply``)."""
    return x.is_cuda and projection_kernels().fused_rows_apply(x, weight)


def fusable_output(x: torch.Tensor, weight: torch.Tensor | Fp8Weight | Int4Weight) -> bool:
    """Whether ``project_add_ready`` and ``mlp_fused`` serve x [n, in] @ weight.T: where the fused kernels read
    the weight (``fusable_rows``), or for an fp8 or INT4 weight on few rows its quantized product, the residual
    add and the next norm's readying in the product's store (layers/fused_projection.py ``quantized_rows_apply``)."""
    return fusable_rows(x, weight) or (
        x.is_cuda and projection_kernels().quantized_rows_apply(x, weight)
    )


def fusable_qkv(x: torch.Tensor, weight: torch.Tensor | Fp8Weight | Int4Weight) -> bool:
    """Whether ``norm_project_qkv`` (layers/fused_projection.py) serves x [n, in] @ weight.T with its
    per-head work: where the fused kernels read the weight (``fusable_rows``), or for an fp8 or INT4 weight
    on few rows (``quantized_qkv_apply``: the quantized product, then the per-head kernel)."""
    return fusable_rows(x, weight) or (
        x.is_cuda and projection_kernels().quantized_qkv_apply(x, weight)
    )


def fused_weight(proj) -> torch.Tensor | Fp8Weight | Int4Weight | None:
    """The weight the fused kernels read for a projection: a projection's or a packed one's
    (layers/decoder.py ``PackedProjection``: a tensor, an ``Fp8Weight`` or an ``Int4Weight``), a projection
    stored quantized as its ``kernel_weight``; None where they cannot read it: INT4 in batch-invariant mode (the
    quantized product, the one kernel that reads it, is not batch-invariant; layers/fused_projection.py
    ``_quantized_product``)."""
    weight = proj.kernel_weight() if isinstance(proj, QuantizedLinear) else proj.weight
    return None if isinstance(weight, Int4Weight) and batch_invariant() else weight


def norm_offset(norm: nn.Module) -> float:
    """What an RMSNorm module adds to its weight (layers/norm.py: Gemma 3's are 1 + w)."""
    return getattr(norm, "offset", 0.0)


@dataclass
class NormalisedRows:
    """A residual stream whose next RMSNorm ran as a launch of its own: after a block that had to
    materialise its normalised input (a sparse MoE's router and experts read it), the block's output is
    added to the stream and normalised for the next block in one launch (``add_normalised``). The next
    block reads ``x`` where it would fold the norm into its input projection (``project_normalised``).
    """

    stream: torch.Tensor  # [n, hidden]
    x: torch.Tensor  # [n, hidden]: the next norm of the stream


def ends_block(proj: nn.Module) -> bool:
    """Whether ``project_add_ready`` serves a block's output projection: one whole, or a row-parallel shard
    that reduces its own partial sums (not one whose caller sums several: a mixture's shared expert)."""
    return not is_sharded(proj) or getattr(proj, "reduces", False)


def block_fuses(x: torch.Tensor, input_proj, output_proj: nn.Module) -> bool:
    """Whether a block over x [n, hidden] runs fused: its input projection (a projection or a packed one,
    ``weight`` [out, hidden]) reads the stream through the norm-folding kernels (``project_normalised``)
    and its output projection adds the residual (``project_add_ready``): both without bias and of weights
    the kernels read (``fused_weight``; fp8 ones through their quantized product, ``fusable_output``), the
    output projection one that ``ends_block``, and few rows on the GPU."""
    return (
        all(
            p is not None and fused_weight(p) is not None and p.bias is None
            for p in (input_proj, output_proj)
        )
        and ends_block(output_proj)
        and fusable_output(x, fused_weight(input_proj))
    )


def project_normalised(rows, eps: float, weight: torch.Tensor, relu2: bool = False) -> torch.Tensor:
    """A block's input projection, RMSNorm(rows.stream) @ weight.T [n, out] (relu(.)^2 of it with ``relu2``):
    the norm (of eps ``eps``) folded into the projection for ``NormedRows``; for ``NormalisedRows`` a plain
    few-row projection of the input already normalised."""
    kernels = projection_kernels()
    if isinstance(rows, NormalisedRows):
        return kernels.project_rows(rows.x, weight, relu2=relu2)
    return kernels.norm_project(rows, eps, weight, relu2=relu2)


def kernel_rows(rows):
    """What a norm-folding projection kernel (layers/fused_projection.py) reads for a block's input ``rows``:
    ``NormedRows`` as they are (the norm folded in), the input already normalised of ``NormalisedRows``."""
    return rows.x if isinstance(rows, NormalisedRows) else rows


def normalised_input(rows, norm: nn.Module) -> torch.Tensor:
    """A block's input materialised, norm(rows.stream) [n, hidden], for a block that reads it whole (a
    sparse MoE): ``NormalisedRows.x``, or one launch of the norm module."""
    return rows.x if isinstance(rows, NormalisedRows) else norm(rows.stream)


def add_normalised(x: torch.Tensor, stream: torch.Tensor, next_norm: nn.Module) -> NormalisedRows:
    """stream + x [n, hidden], and ``next_norm`` of it, in one launch (the norm module's residual add)."""
    normed, added = next_norm(x, stream)
    return NormalisedRows(added, normed)


def reduce_add_normalised(
    partial: torch.Tensor, stream: torch.Tensor, next_norm: nn.Module, group: RankGroup
) -> NormalisedRows:
    """``add_normalised`` of partial [n, hidden] summed over ``group`` (a row-parallel block's output): the
    all-reduce, the add and the norm in one launch where layers/all_reduce_norm.py serves them, else the
    all-reduce and ``add_normalised``."""
    if group.size > 1 and group.symmetric is not None:  # (GPUs: the kernel's module imports Triton)
        from outpace.layers.all_reduce_norm import all_reduce_add_rms_norm

        fused = all_reduce_add_rms_norm(partial, stream, next_norm, group)
        if fused is not None:
            return NormalisedRows(fused[1], fused[0])
    return add_normalised(all_reduce(partial, group), stream, next_norm)


# ---- Llama-family attention and layers --------------------------------------------------------------


def projects_fused(attn: DecoderAttention, x: torch.Tensor) -> bool:
    """Whether one fused kernel projects x [num_tokens, in] to q/k/v and writes k and v into a cache:
    few half-precision rows on the GPU, packed q/k/v without bias (half precision, or fp8 through its
    quantized product and the per-head kernel: ``fusable_qkv``), per-head q/k norms (if any) over a
    power-of-two head_dim."""
    head_dim = attn.cfg.head_dim
    return (
        attn.qkv is not None
        and attn.qkv.bias is None
        and ends_block(attn.o_proj)
        and fused_weight(attn.o_proj) is not None
        and fusable_qkv(x, attn.qkv.weight)
        and (not attn.cfg.qk_norm or head_dim & (head_dim - 1) == 0)
    )


def attention_fuses(attn: DecoderAttention, x: torch.Tensor) -> bool:
    """Whether ``attend_fused`` serves x [num_tokens, hidden]: ``projects_fused``, and a backend that
    attends over a cache the projection wrote."""
    return projects_fused(attn, x) and attn.attn.fused_write_target() is not None


def project_fused(
    attn: DecoderAttention,
    rows,
    eps: float,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    kv_only: bool = False,
) -> torch.Tensor:
    """The fused q/k/v kernel (``projects_fused``): k and v of ``rows`` (as in ``attend_fused``) into
    the caches at ``slots`` [num_tokens]; returns q [num_tokens, q_size] ([num_tokens, 0] with
    ``kv_only``, which projects only the k and v rows of the packed weight), scaled by position where the
    rotary has a query scale (Ministral 3: layers/rotary.py ``scale_queries``, one launch more)."""
    cfg = attn.cfg
    q_norm = (attn.k_norm if kv_only else attn.q_norm) if cfg.qk_norm else None
    qk_norm = (q_norm.weight, attn.k_norm.weight, attn.k_norm.eps) if cfg.qk_norm else None
    weight = attn.qkv.weight
    if kv_only:
        weight = (
            weight.rows(attn.q_size)
            if isinstance(weight, (Fp8Weight, Int4Weight))
            else weight[attn.q_size :]
        )
    q = projection_kernels().norm_project_qkv(
        rows,
        eps,
        weight,
        cfg.head_dim,
        0 if kv_only else attn.q_size,
        positions,
        attn.rotary.cos,
        attn.rotary.sin,
        k_cache,
        v_cache,
        slots,
        qk_norm=qk_norm,
    )
    return q if kv_only else attn.rotary.scale_queries(q, positions)


def attend_fused(attn: DecoderAttention, positions: torch.Tensor, rows, eps: float) -> torch.Tensor:
    """rows: the residual stream made ready for the input norm (``NormedRows``, [num_tokens, hidden]; or
    ``NormalisedRows``), or an input already normalised ([num_tokens, input_size]) -> attention output
    [num_tokens, heads * head_dim] (before o_proj). One kernel normalises, projects, applies the q/k norms,
    rotates and writes k and v into the cache; the backend then attends over the cache."""
    q = project_fused(attn, kernel_rows(rows), eps, positions, *attn.attn.fused_write_target())
    return attn.attn.attend_written(q.view(q.shape[0], -1, attn.cfg.head_dim), positions)


def write_kv(
    attn: DecoderAttention, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """``DecoderAttention.write_kv`` (k and v of x [n, in] at positions [n] into the layer's paged cache
    at slot_mapping [n], without attending); few rows on the GPU: the fused q/k/v kernel's k/v-only form."""
    k_cache, v_cache = attn.attn.kv_cache  # [num_blocks, block_size, kv_heads, head_dim]
    fused = projects_fused(attn, x) and not attn.attn.fp8_cache  # (the kernel does not quantize)
    if fused and k_cache.is_contiguous() and v_cache.is_contiguous():
        project_fused(attn, x, 0.0, positions, k_cache, v_cache, slot_mapping, kv_only=True)
    else:
        attn.write_kv(x, positions, slot_mapping)


def mlp_fuses(mlp: GatedMLP) -> bool:
    """Whether the fused kernels (``fused_attention_output_and_mlp``: SiLU or GELU-tanh, no biases)
    compute this MLP, its gate and up packed or apart (``mlp_inputs``)."""
    return (
        all(p.bias is None and fused_weight(p) is not None for p in mlp_inputs(mlp))
        and mlp.down_proj.bias is None
        and mlp.act in FUSED_ACTIVATIONS
        and ends_block(mlp.down_proj)
        and fused_weight(mlp.down_proj) is not None
    )


def mlp_inputs(mlp: GatedMLP) -> list:
    """A gated MLP's input projections as the fused path runs them: gate/up packed, else gate and up apart
    (fp8 ones whose scale blocks do not let them pack: DeepSeek-V2-Lite's dense MLP, 10944 rows each in
    128-row blocks)."""
    return [mlp.gate_up] if mlp.gate_up is not None else [mlp.gate_proj, mlp.up_proj]


def gate_up_normalised(mlp: GatedMLP, rows, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up products [n, inter] each of the MLP's input norm (of eps ``eps``) of ``rows``
    (``project_normalised``): one launch over gate/up packed, else one each (``mlp_inputs``)."""
    products = [project_normalised(rows, eps, fused_weight(p)) for p in mlp_inputs(mlp)]
    return tuple(products[0].chunk(2, dim=-1)) if len(products) == 1 else tuple(products)


def swiglu_normalised(mlp: GatedMLP, rows, eps: float) -> torch.Tensor:
    """act(gate) * up [n, inter] of the MLP's input norm of ``rows``: gate/up packed in one kernel with the
    gating in its epilogue (``norm_project_swiglu``), else ``gate_up_normalised`` and a launch for the
    gating."""
    if mlp.gate_up is None:
        return act_and_mul(mlp.act, *gate_up_normalised(mlp, rows, eps))
    return projection_kernels().norm_project_swiglu(
        kernel_rows(rows), eps, mlp.gate_up.weight, act=mlp.act
    )


def mlp_reads_rows(mlp: GatedMLP) -> bool:
    """Whether ``mlp_normalised`` computes this MLP: gate and up without biases, of weights the norm-folding
    kernels read."""
    return all(p.bias is None and fused_weight(p) is not None for p in mlp_inputs(mlp))


def mlp_normalised(mlp: GatedMLP, rows, eps: float) -> torch.Tensor:
    """A gated MLP (``mlp_reads_rows``) over its input norm (of eps ``eps``) of ``rows`` (``NormedRows``) ->
    its output [n, hidden], no residual added: a shared expert beside a MoE block's experts on the fused
    stack, which reads the stream made ready for the block's norm as the routing and the experts do
    (layers/moe.py ``moe_on_kernels``), so that the norm costs no launch. Gate/up with the norm folded in
    (and the gating, where the kernels compute it: ``gated_normalised``), then down_proj as the module runs
    it."""
    return mlp.down_proj(gated_normalised(mlp, rows, eps))


def gated_normalised(mlp: GatedMLP, rows, eps: float) -> torch.Tensor:
    """The MLP's gating of its gate and up products [n, inter] over its input norm of ``rows``: in the gate/up
    kernel (``swiglu_normalised``) where it is act(gate) * up of a fused activation (``GatedMLP.gating_fuses``),
    else ``GatedMLP.gated`` (Step-3.5's clamp) after the products."""
    if mlp.gating_fuses and mlp.act in FUSED_ACTIVATIONS:
        return swiglu_normalised(mlp, rows, eps)
    return mlp.gated(*gate_up_normalised(mlp, rows, eps))


def layer_fuses(attn: DecoderAttention, mlp: GatedMLP, x: torch.Tensor) -> bool:
    """Whether the fused kernels compute a layer of this attention and MLP over x [num_tokens, in]:
    ``attention_fuses``, and what ``fused_attention_output_and_mlp`` computes (no o_proj bias, an
    MLP that ``mlp_fuses``)."""
    return mlp_fuses(mlp) and attn.o_proj.bias is None and attention_fuses(attn, x)


def reduced_product(x: torch.Tensor, proj: nn.Module) -> torch.Tensor:
    """x [n, in] @ a row-parallel shard's weight.T, summed over its group (``ends_block``): [n, out]."""
    return all_reduce(projection_kernels().project_rows(x, fused_weight(proj)), proj.group)


def project_add_ready(
    x: torch.Tensor, proj: nn.Module, stream: torch.Tensor, next_norm: nn.Module | None
):
    """The projection that ends a block, fused (``block_fuses``): x [n, in], stream [n, hidden] -> stream +
    x @ proj.weight.T, made ready for ``next_norm`` (any ``norm_offset``) when given (``NormedRows``), else a
    tensor [n, hidden]. One projection kernel; for a row-parallel shard (``ends_block``) its partial sums, then
    ``reduce_add_normalised`` (``NormalisedRows``: the all-reduce, the residual add and the next norm in one
    launch where layers/all_reduce_norm.py serves them)."""
    kernels = projection_kernels()
    if is_sharded(proj):
        if next_norm is None:
            return stream + reduced_product(x, proj)
        partial = kernels.project_rows(x, fused_weight(proj))
        return reduce_add_normalised(partial, stream, next_norm, proj.group)
    if next_norm is None:
        return kernels.project_add(x, fused_weight(proj), stream)
    return kernels.project_add_normed(
        x, fused_weight(proj), stream, next_norm.weight, next_offset=norm_offset(next_norm)
    )


def project_add_normalised(
    x: torch.Tensor, proj: nn.Module, stream: torch.Tensor, norm: nn.Module
) -> NormalisedRows:
    """The projection that ends a block whose next block reads its input materialised (a sparse MoE): x [n,
    in], stream [n, hidden] -> the new stream and ``norm`` of it (``NormalisedRows``). The fused residual
    add and the norm module; for a row-parallel shard (``ends_block``) its partial sums, then
    ``reduce_add_normalised`` (their all-reduce, the add and the norm), as ``project_add_ready``."""
    if is_sharded(proj):
        return project_add_ready(x, proj, stream, norm)
    added = projection_kernels().project_add(x, fused_weight(proj), stream)
    return NormalisedRows(added, norm(added))


def moe_block_fused(
    out: torch.Tensor,
    proj: nn.Module,
    stream: torch.Tensor,
    norm: nn.Module,
    next_norm: nn.Module,
    moe: Callable,
    takes_rows: bool,
    group: RankGroup,
):
    """The end of a layer whose MLP is a sparse MoE, on the fused stack: ``proj`` (out_proj / o_proj) over
    out [n, in] adds the residual ``stream``, then ``moe(x, ready, row_norm)`` (this rank's part of the
    block) over the post-attention ``norm`` of the new stream -> the layer's output made ready for
    ``next_norm``. On one GPU the experts' combine adds their output to the stream and readies the next norm
    (layers/moe.py ``ReadyStream``), and where the block ``takes_rows`` it reads the stream made ready for
    its norm (``RowNorm``: the norm folded into routing and gate/up), else the norm runs as a launch; under
    tensor parallelism the parts are all-reduced, added and normalised in one launch."""
    if group.size > 1:
        mid = project_add_normalised(out, proj, stream, norm)
        return reduce_add_normalised(moe(mid.x, None, None), mid.stream, next_norm, group)
    if takes_rows:
        mid = project_add_ready(out, proj, stream, norm)  # (NormedRows)
        x, row_norm = mid.normed, RowNorm.of(mid, norm.eps)
    else:
        mid = project_add_normalised(out, proj, stream, norm)
        x, row_norm = mid.x, None
    return moe(x, ReadyStream(mid.stream, next_norm.weight, norm_offset(next_norm)), row_norm)


def mlp_fused(mlp: GatedMLP, rows, eps: float, next_norm: nn.Module | None):
    """A gated MLP block (``mlp_fuses``) over rows (``NormedRows``: the stream made ready for the MLP's
    input norm, of eps ``eps``; or ``NormalisedRows``) -> the block's output stream, made ready for
    ``next_norm`` when given. Two projection kernels: gate/up with the norm and the gating folded in
    (``gated_normalised``: a gating beyond act(gate) * up a launch between), down with the residual add."""
    return project_add_ready(
        gated_normalised(mlp, rows, eps), mlp.down_proj, rows.stream, next_norm
    )


def fused_attention_output_and_mlp(
    attn: torch.Tensor,
    stream: torch.Tensor,
    o_proj: nn.Linear,
    post_norm: RMSNorm,
    mlp: GatedMLP,
    next_norm: RMSNorm | None,
):
    """The rest of a decoder layer after attention, fused: attn [n, heads * head_dim], stream [n, hidden]
    (the residual stream) -> the layer's output stream, made ready for ``next_norm`` when given
    (``NormedRows``), else a tensor [n, hidden]. Three projection kernels."""
    mid = project_add_ready(attn, o_proj, stream, post_norm)
    return mlp_fused(mlp, mid, post_norm.eps, next_norm)


class FusedDecoderLayer(DecoderLayer):
    """``DecoderLayer`` that takes the fused path (``layer_fuses``: few rows on the GPU) where it serves
    the rows, the eager one elsewhere."""

    def forward_residual(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``DecoderLayer.forward_residual``; on the fused path, (the output stream, None)."""
        if not self.fuses(h):
            return super().forward_residual(positions, h, residual)
        rows = row_norm_kernels().normed_rows(
            residual_stream(h, residual), self.input_layernorm.weight
        )
        return self.forward_fused(positions, rows, None), None

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``forward_fused`` serves h [num_tokens, hidden] (``layer_fuses``)."""
        return layer_fuses(self.self_attn, self.mlp, h)

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: RMSNorm | None):
        """rows: the layer's input stream made ready for its input norm (``NormedRows``, or after a
        row-parallel block ``NormalisedRows``) -> its output stream, made ready for ``next_norm`` (the next
        layer's input norm) when given, else a tensor [num_tokens, hidden]. Four projection kernels (norms, RoPE, the KV write, the residual adds and
        SiLU*mul folded in) around the attention kernel."""
        attn = attend_fused(self.self_attn, positions, rows, self.input_layernorm.eps)
        return fused_attention_output_and_mlp(
            attn,
            rows.stream,
            self.self_attn.o_proj,
            self.post_attention_layernorm,
            self.mlp,
            next_norm,
        )


def run_layers(
    layers: list[FusedDecoderLayer],
    final_norm: RMSNorm,
    positions: torch.Tensor,
    h: torch.Tensor,
    capture: tuple[int, ...],
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """A stack of decoder layers over h [num_tokens, hidden] -> (the last layer's output stream
    [num_tokens, hidden], before ``final_norm``; {layer index in ``capture``: that layer's input stream}).

    Few rows on the GPU take the fused path (``run_fused_layers``). Otherwise each residual add is fused
    into the RMSNorm after it (``forward_residual``)."""
    if layers[0].fuses(h):
        norms = [layer.input_layernorm for layer in layers]
        return run_fused_layers(layers, norms, final_norm, positions, h, capture)
    return run_residual_stack(layers, positions, h, capture)


def run_fused_layers(
    layers: list[nn.Module],
    input_norms: list[nn.Module],
    final_norm: nn.Module,
    positions: torch.Tensor,
    h: torch.Tensor,
    capture: tuple[int, ...],
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``run_layers``'s fused path for layers with ``forward_fused(positions, rows, next_norm)`` whose first
    norm is ``input_norms[i]`` (any ``norm_offset``): each layer hands the next its output stream already
    made ready for the next input norm (``final_norm`` after the last), as ``NormedRows`` or, after a block
    that materialised its input, ``NormalisedRows``. h [num_tokens, hidden] -> as ``run_layers``."""
    captured = {}
    norms = list(input_norms[1:]) + [final_norm]  # the norm after each layer
    first = input_norms[0]
    rows = row_norm_kernels().normed_rows(h, first.weight, norm_offset(first))
    for i, (layer, next_norm) in enumerate(zip(layers, norms)):
        if i in capture:
            captured[i] = rows.stream
        rows = layer.forward_fused(positions, rows, next_norm)
    return rows.stream, captured


def run_stack(
    layers: list[nn.Module],
    input_norms: list[nn.Module],
    final_norm: nn.Module,
    positions: torch.Tensor,
    h: torch.Tensor,
    capture: tuple[int, ...],
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """A stack whose layers differ (the hybrids' blocks): ``run_fused_layers`` where every layer takes the
    fused path on h (its ``fuses``), else ``run_residual_stack``; -> as ``run_layers``."""
    if all(layer.fuses(h) for layer in layers):
        return run_fused_layers(layers, input_norms, final_norm, positions, h, capture)
    return run_residual_stack(layers, positions, h, capture)


def run_layer(
    layer: nn.Module, positions: torch.Tensor, h: torch.Tensor, next_norm: nn.Module
) -> torch.Tensor:
    """One decoder layer over h [num_tokens, hidden] -> its output stream [num_tokens, hidden] (before any
    norm): ``run_stack`` of that layer alone, its output made ready for ``next_norm``, the norm that reads it
    next (an MTP draft layer's head norm). Its eager path is the layer's own forward."""
    return run_stack([layer], [layer.input_layernorm], next_norm, positions, h, ())[0]


def norm_head_logits(
    norm: RMSNorm,
    head: nn.Module,
    hidden: torch.Tensor,
    out: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """[n, hidden] pre-norm -> [n, vocab] float32 logits: the final norm (any ``norm_offset``), then the
    head (a module with a ``weight`` [vocab, hidden]), soft-capped at ``softcap`` when given (Gemma's
    final_logit_softcapping); one fused kernel for few rows on the GPU. ``out``: a float32 [n, vocab]
    tensor to write them into (returned), instead of a new one."""
    weight = fused_weight(head)
    if not is_sharded(head) and weight is not None and fusable_rows(hidden, weight):
        kernels = projection_kernels()
        return kernels.norm_project(
            row_norm_kernels().normed_rows(hidden, norm.weight, norm_offset(norm)),
            norm.eps,
            weight,
            out_dtype=torch.float32,
            out=out,
            softcap=softcap,
        )
    logits = head(norm(hidden)).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap  # (layers/embedding.py softcap)
    return logits if out is None else out.copy_(logits)


def head_logits(norm: RMSNorm | None, head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """[n, hidden] -> [n, columns] float32 logits of ``head``, after ``norm`` (``norm_head_logits``) or, where
    None, of hidden as it comes (a state that is already normed)."""
    return head(hidden).float() if norm is None else norm_head_logits(norm, head, hidden)


def head_argmax_tokens(
    head: nn.Module,
    hidden: torch.Tensor,
    norm: RMSNorm | None = None,
    rows: torch.Tensor | None = None,
    token_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """A greedy draft's tokens [R] int64: the first argmax of the logits of hidden's rows ``rows`` [R] (all
    when None) under ``head`` (a module with a ``weight`` [columns, hidden]), after ``norm`` when given, looked
    up in ``token_map`` [columns] when given (an EAGLE3 draft's vocabulary -> the target's). Few rows on the
    GPU: one launch, the head's with the argmax folded in (layers/fused_projection.py ``head_argmax``: a NaN
    logit is never chosen there); else the logits, then their argmax."""
    weight = fused_weight(head)
    count = hidden.shape[0] if rows is None else rows.numel()
    if not is_sharded(head) and weight is not None and fusable_rows(hidden[:count], weight):
        kernels = projection_kernels()
        if norm is None:
            return kernels.head_argmax(hidden, weight, rows=rows, token_map=token_map)
        ready = row_norm_kernels().normed_rows(hidden, norm.weight, norm_offset(norm))
        return kernels.head_argmax(ready, weight, norm.eps, rows, token_map)
    picked = hidden if rows is None else hidden[rows]
    logits = head(picked).float() if norm is None else norm_head_logits(norm, head, picked)
    tokens = argmax_last(logits)
    return tokens if token_map is None else token_map[tokens]


# ---- EAGLE3's layer over [embedding | hidden] -------------------------------------------------------


def embed_norm_pair(
    token_ids: torch.Tensor,
    embedding: nn.Embedding,
    embed_norm: RMSNorm,
    hidden: torch.Tensor,
    hidden_norm: RMSNorm,
    fused: bool,
    lookup: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """[embed_norm(embedding(token_ids)) | hidden_norm(hidden)], [n, 2 * hidden] (EAGLE3's and MTP layers'
    input): token_ids [n], hidden [n, hidden]. ``fused``: in one kernel (the caller's rule; each norm's weight
    applied in float32 with its offset); else the modules in turn, the rows looked up by ``lookup`` (default
    ``embedding``)."""
    if fused:
        return row_norm_kernels().embed_norm_pair(
            token_ids,
            embedding.weight,
            (embed_norm.weight, embed_norm.eps, norm_offset(embed_norm)),
            hidden,
            (hidden_norm.weight, hidden_norm.eps, norm_offset(hidden_norm)),
        )
    rows = (lookup or embedding)(token_ids)
    return torch.cat((embed_norm(rows), hidden_norm(hidden)), dim=-1)


def attention_and_mlp(
    attn: DecoderAttention,
    mlp: GatedMLP,
    post_norm: RMSNorm,
    positions: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
) -> torch.Tensor:
    """The rest of a layer whose input is already normalised (EAGLE3's [embedding | hidden]): x [n, in],
    residual [n, hidden] -> h + mlp(post_norm(h)) with h = residual + attention(x), [n, hidden]. Few rows
    on the GPU: four projection kernels around attention."""
    if layer_fuses(attn, mlp, x):
        # x is normalised already: the kernel's input norm is not applied
        out = attend_fused(attn, positions, x, 0.0)
        return fused_attention_output_and_mlp(out, residual, attn.o_proj, post_norm, mlp, None)
    h = residual + attn(positions, x)
    return h + mlp(post_norm(h))
