"""Gemma's few-row fast path: a "sandwich" layer (a norm before and after attention and the MLP) as
the fused projection kernels (layers/fused_projection.py: norms with a (1 + w) scale, per-head q/k norms,
v norm, GELU-tanh gating, the sandwich norms folded into the projections) around the attention kernel,
for any attention with q/k/v packed (layers/decoder.py ``pack_projections``). Chosen as
layers/fused_decoder.py chooses the Llama layer's path: ``sandwich_fuses``, then ``sandwich_rows_fused``.
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.layers.decoder import GatedMLP
from outpace.layers.fused_decoder import (
    ends_block,
    fusable_qkv,
    fused_weight,
    mlp_fuses,
    norm_offset,
    projection_kernels,
    reduced_product,
    row_norm_kernels,
    swiglu_normalised,
)
from outpace.layers.linear import is_sharded


def qkv_fuses(attn: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``attend_fused_qkv`` serves an attention module over x [num_tokens, hidden]: its q/k/v
    packed without bias (layers/decoder.py ``pack_projections``), an o_proj without bias, not sharded,
    per-head q/k norms over a power-of-two ``head_dim``, few half-precision rows on the GPU (of a half-precision
    q/k/v, or an fp8 or INT4 one through its quantized product: ``fusable_qkv``) and a backend that attends over a
    cache the kernel wrote."""
    d = attn.head_dim
    return (
        getattr(attn, "qkv", None) is not None
        and attn.qkv.bias is None
        and attn.o_proj.bias is None
        and ends_block(attn.o_proj)
        and fused_weight(attn.o_proj) is not None
        and d & (d - 1) == 0
        and fusable_qkv(x, attn.qkv.weight)
        and attn.attn.fused_write_target() is not None
    )


def attend_fused_qkv(
    attn: nn.Module,
    positions: torch.Tensor,
    rows,
    eps: float,
    v_norm: bool = False,
    qkv: tuple[torch.Tensor, int] | None = None,
    out_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``attend_fused`` for another attention module with q_proj/k_proj/v_proj packed as ``qkv``,
    ``q_norm``/``k_norm`` per head (any ``norm_offset``), ``rotary``, ``attn`` and ``head_dim``
    (Gemma's): rows (``NormedRows``, or a tensor already normalised) -> the attention output [num_tokens,
    heads * head_dim] before o_proj. ``v_norm``: v heads normalised without a weight (Gemma 4); ``qkv``:
    (the packed [q | k | v] weight, q's rows) where they are not ``attn.qkv`` (Step-3.5's rows of its
    packed in-projections); ``out_gate``: an output gate's logits projected apart ([num_tokens, heads]:
    Step-3.5's head-wise gate), applied in the attention's launch (``attend_written``). An ``attn.qkv`` of
    q and k alone (``pack_projections`` for a module without v_proj: Gemma 4's k = v layers) takes v from
    k's projection."""
    weight, q_size = qkv or (attn.qkv.weight, attn.qkv.sizes[0])
    v_from_k = qkv is None and len(attn.qkv.sizes) == 2
    q = projection_kernels().norm_project_qkv(
        rows,
        eps,
        weight,
        attn.head_dim,
        q_size,
        **_heads_args(attn, positions),
        v_norm=v_norm,
        v_from_k=v_from_k,
    )
    return attn.attn.attend_written(q.view(q.shape[0], -1, attn.head_dim), positions, out_gate)


def attend_fused_qkv_gate(
    attn: nn.Module,
    positions: torch.Tensor,
    rows,
    eps: float,
    weight: torch.Tensor,
    q_size: int,
    gate_size: int,
    interleaved: bool = False,
) -> torch.Tensor:
    """``attend_fused_qkv`` over a packed half-precision weight of q, k, v and an output gate
    (layers/fused_projection.py ``norm_project_qkv_gate``: [q | k | v | gate], Step-3.5's head-wise gate;
    ``interleaved``, each q head's gate beside it, Qwen3-Next's) -> the gated attention output [num_tokens,
    heads * head_dim] before o_proj, attention times sigmoid(gate) as ``sigmoid_gate`` gives it: the gate is
    projected in q/k/v's launch (float32 products) and applied in the attention's (``attend_written``'s
    ``out_gate``), so it costs no launch of its own."""
    q, gate = projection_kernels().norm_project_qkv_gate(
        rows,
        eps,
        weight,
        attn.head_dim,
        q_size,
        gate_size,
        **_heads_args(attn, positions),
        interleaved=interleaved,
    )
    return attn.attn.attend_written(q.view(q.shape[0], -1, attn.head_dim), positions, gate)


def _heads_args(attn: nn.Module, positions: torch.Tensor) -> dict:
    """``norm_project_qkv``'s keyword arguments for ``attn``'s heads: RoPE, the cache write, the q/k norms."""
    k_cache, v_cache, slots = attn.attn.fused_write_target()
    return dict(
        positions=positions,
        cos=attn.rotary.cos,
        sin=attn.rotary.sin,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slots,
        qk_norm=(attn.q_norm.weight, attn.k_norm.weight, attn.k_norm.eps),
        qk_offset=norm_offset(attn.q_norm),
    )


def fused_sandwich_rest(
    attn: torch.Tensor,
    stream: torch.Tensor,
    o_proj: nn.Linear,
    norms: tuple[nn.Module, ...],
    mlp: GatedMLP,
    scale: torch.Tensor | None = None,
    next_norm: nn.Module | None = None,
):
    """The rest of a "sandwich" layer after attention (Gemma: a norm before and after attention and the
    MLP), fused: attn [n, heads * head_dim], stream [n, hidden]; norms (post-attention, pre-MLP,
    post-MLP) -> stream + post(o) = mid, then mid + post_mlp(mlp(pre_mlp(mid))), times ``scale`` [1] when
    given (Gemma 4's layer_scalar): [n, hidden], or made ready for ``next_norm`` when given (``NormedRows``:
    the next layer's input norm, prepared by the last add's kernel). Two projection kernels that also
    prepare the norm after them, two row kernels that add the normed output to the stream, and the gate/up
    kernel."""
    kernels = row_norm_kernels()
    post_attn, pre_mlp, post_mlp = norms
    o = _project_normed(attn, o_proj, post_attn)
    mid = kernels.add_normed(o, post_attn.eps, stream, (pre_mlp.weight, norm_offset(pre_mlp)))
    act = swiglu_normalised(mlp, mid, pre_mlp.eps)
    down = _project_normed(act, mlp.down_proj, post_mlp)
    ready = None if next_norm is None else (next_norm.weight, norm_offset(next_norm))
    return kernels.add_normed(down, post_mlp.eps, mid.stream, ready, scale=scale)


def _project_normed(x: torch.Tensor, proj: nn.Module, norm: nn.Module):
    """x @ proj's weight.T made ready for the sandwich norm ``norm`` (``NormedRows``): one kernel, or for a
    row-parallel shard (``ends_block``) the plain projection, the all-reduce and one row kernel."""
    if is_sharded(proj):
        return row_norm_kernels().normed_rows(
            reduced_product(x, proj), norm.weight, norm_offset(norm)
        )
    return projection_kernels().project_normed(
        x, fused_weight(proj), norm.weight, norm_offset(norm)
    )


def input_rows(layer: nn.Module, h: torch.Tensor):
    """h [n, hidden], a stream no fused kernel wrote, made ready for ``layer.input_layernorm``
    (``NormedRows``): one launch."""
    norm = layer.input_layernorm
    return row_norm_kernels().normed_rows(h, norm.weight, norm_offset(norm))


def _attention_fused(layer: nn.Module, positions: torch.Tensor, rows, v_norm: bool) -> torch.Tensor:
    """``layer.self_attn`` over ``layer.input_layernorm`` of rows (``NormedRows``) on the fused path, before
    o_proj."""
    return attend_fused_qkv(layer.self_attn, positions, rows, layer.input_layernorm.eps, v_norm)


def attention_block_fused(
    layer: nn.Module, positions: torch.Tensor, rows, v_norm: bool = False
) -> torch.Tensor:
    """The attention block of a sandwich layer whose MLP side runs unfused (Gemma 4's MoE layers) on the
    fused path (``qkv_fuses``): rows (the input stream made ready for the input norm, ``NormedRows``) ->
    o_proj's output [n, hidden], from the packed q/k/v with the input norm and their own norms, RoPE and
    cache write in one kernel, attention, and o_proj."""
    return layer.self_attn.o_proj(_attention_fused(layer, positions, rows, v_norm))


def sandwich_fuses(attn: nn.Module, mlp: GatedMLP, h: torch.Tensor) -> bool:
    """Whether ``fused_sandwich_rest`` and ``attend_fused_qkv`` serve a sandwich layer over h."""
    return mlp_fuses(mlp) and qkv_fuses(attn, h)


def sandwich_rows_fused(
    layer: nn.Module,
    positions: torch.Tensor,
    rows,
    v_norm: bool = False,
    scale: torch.Tensor | None = None,
    next_norm: nn.Module | None = None,
):
    """A sandwich layer (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm``, ``mlp``, ``post_feedforward_layernorm``) on the fused path
    (``sandwich_fuses``) over its input stream made ready for its input norm (``NormedRows``: ``input_rows``,
    or the layer before's last kernel) -> its output stream [n, hidden] (times ``scale`` when given), made
    ready for ``next_norm`` when given (``NormedRows``): a stack of these layers spends no launch on a
    layer's input norm."""
    attn = _attention_fused(layer, positions, rows, v_norm)
    norms = (
        layer.post_attention_layernorm,
        layer.pre_feedforward_layernorm,
        layer.post_feedforward_layernorm,
    )
    return fused_sandwich_rest(
        attn, rows.stream, layer.self_attn.o_proj, norms, layer.mlp, scale, next_norm
    )
