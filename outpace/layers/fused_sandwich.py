"""The few-row fast paths of attention modules other than the Llama layer's with q/k/v packed (Gemma's,
Step-3.5's). Gemma's: a "sandwich" layer (a norm before and after attention and the MLP) as
the fused projection kernels (layers/fused_projection.py: norms with a (1 + w) scale, per-head q/k norms,
v norm, GELU-tanh gating, the sandwich norms folded into the projections) around the attention kernel,
for any attention with q/k/v packed (layers/decoder.py ``pack_projections``). Chosen as
layers/fused_decoder.py chooses the Llama layer's path: ``sandwich_fuses``, then ``sandwich_layer_fused``.

A sandwich norm needs its input's whole row (o_proj's or down's output), which no program of the
projection computing it has. Rather than a row kernel after each (the add, the norm), the stream stays
split between fused layers (layers/fused_projection.py ``SplitRows``: base + c * delta, c the norm's
row scale), and the kernels that read it finish it: so a layer is four projection kernels, as a Llama
layer, and a stack of fused layers adds one row kernel in front (``normed_rows``) and one behind
(``stream_tensor``).

Step-3.5's pre-norm layer (zero-centred norms, a head-wise sigmoid gate on the attention output, SwiGLU
clamps): ``pre_norm_attention_fused`` and ``pre_norm_mlp_fused``, the Llama layer's kernels plus the
gate's small projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from outpace.layers.decoder import GatedMLP
from outpace.layers.fused_decoder import fusable_rows, mlp_fuses, norm_offset, projection_kernels
from outpace.layers.linear import is_sharded

if TYPE_CHECKING:  # fused_projection imports Triton, a GPU-only dependency
    from outpace.layers.fused_projection import NormedRows, SplitRows


def qkv_fuses(attn: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``attend_fused_qkv`` serves an attention module over x [num_tokens, hidden]: its q/k/v
    packed without bias (layers/decoder.py ``pack_projections``), an o_proj without bias, not sharded,
    per-head q/k norms over a power-of-two ``head_dim``, RoPE over whole heads or their first half
    (Step-3.5's full layers), few half-precision rows on the GPU and a backend that attends over a cache
    the kernel wrote."""
    d = attn.head_dim
    return (
        getattr(attn, "qkv", None) is not None
        and attn.qkv.bias is None
        and attn.o_proj.bias is None
        and not is_sharded(attn.o_proj)
        and d & (d - 1) == 0
        and attn.rotary.cos.shape[-1] in (d // 2, d // 4)
        and fusable_rows(x, attn.qkv.weight)
        and attn.attn.fused_write_target() is not None
    )


def attend_fused_qkv(
    attn: nn.Module, positions: torch.Tensor, rows, eps: float, v_norm: bool = False
) -> torch.Tensor:
    """``attend_fused`` for another attention module with q_proj/k_proj/v_proj packed as ``qkv``,
    ``q_norm``/``k_norm`` per head (any ``norm_offset``), ``rotary``, ``attn`` and ``head_dim``
    (Gemma's): rows (``NormedRows``) -> the attention output [num_tokens, heads * head_dim] before
    o_proj. ``v_norm``: v heads normalised without a weight (Gemma 4)."""
    k_cache, v_cache, slots = attn.attn.fused_write_target()
    q = projection_kernels().norm_project_qkv(
        rows,
        eps,
        attn.qkv.weight,
        attn.head_dim,
        attn.qkv.sizes[0],
        positions,
        attn.rotary.cos,
        attn.rotary.sin,
        k_cache,
        v_cache,
        slots,
        qk_norm=(attn.q_norm.weight, attn.k_norm.weight, attn.k_norm.eps),
        qk_offset=norm_offset(attn.q_norm),
        v_norm=v_norm,
    )
    return attn.attn.attend_written(q.view(q.shape[0], -1, attn.head_dim), positions)


def stream_tensor(stream: torch.Tensor | SplitRows) -> torch.Tensor:
    """A residual stream as a tensor [n, hidden]: itself, or a fused layer's split output added up."""
    return stream if isinstance(stream, torch.Tensor) else projection_kernels().stream_of(stream)


def stream_rows(stream: torch.Tensor | SplitRows) -> torch.Tensor:
    """A tensor of the stream's shape and dtype [n, hidden] (what ``sandwich_fuses`` decides on)."""
    return stream if isinstance(stream, torch.Tensor) else stream.base


def _post_norm(norm: nn.Module) -> tuple[torch.Tensor, float, float]:
    """A sandwich norm as ``project_sandwich`` takes it: (weight, eps, offset)."""
    return norm.weight, norm.eps, norm_offset(norm)


def fused_sandwich_rest(
    attn: torch.Tensor,
    stream: torch.Tensor | SplitRows,
    o_proj: nn.Linear,
    norms: tuple[nn.Module, ...],
    mlp: GatedMLP,
    scale: torch.Tensor | None = None,
    next_norm: nn.Module | None = None,
) -> SplitRows:
    """The rest of a "sandwich" layer after attention (Gemma: a norm before and after attention and the
    MLP), fused: attn [n, heads * head_dim], stream: the layer's input stream ([n, hidden], or a
    ``SplitRows``); norms (post-attention, pre-MLP, post-MLP) -> stream + post(o) = mid, then
    mid + post_mlp(mlp(pre_mlp(mid))), times ``scale`` [1] when given (Gemma 4's layer_scalar), as a
    ``SplitRows`` made ready for ``next_norm`` when given. Three projection kernels: o_proj and down
    leave the sandwich norm after them to their readers (``project_sandwich``), gate/up finishes
    pre_mlp's input."""
    kernels = projection_kernels()
    post_attn, pre_mlp, post_mlp = norms
    mid = kernels.project_sandwich(
        attn, o_proj.weight, stream, _post_norm(post_attn), (pre_mlp.weight, norm_offset(pre_mlp))
    )
    act = kernels.norm_project_swiglu(mid, pre_mlp.eps, mlp.gate_up.weight, act=mlp.act)
    after = None if next_norm is None else (next_norm.weight, norm_offset(next_norm))
    return kernels.project_sandwich(
        act, mlp.down_proj.weight, mid, _post_norm(post_mlp), after, scale
    )


def sandwich_fuses(attn: nn.Module, mlp: GatedMLP, h: torch.Tensor) -> bool:
    """Whether ``fused_sandwich_rest`` and ``attend_fused_qkv`` serve a sandwich layer over h."""
    return mlp_fuses(mlp) and qkv_fuses(attn, h)


def sandwich_layer_fused(
    layer: nn.Module,
    positions: torch.Tensor,
    stream: torch.Tensor | SplitRows,
    v_norm: bool = False,
    scale: torch.Tensor | None = None,
    next_norm: nn.Module | None = None,
) -> SplitRows | torch.Tensor:
    """A sandwich layer (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm``, ``mlp``, ``post_feedforward_layernorm``) on the fused path
    (``sandwich_fuses``): stream, its input [n, hidden] or the previous fused layer's output made ready
    for this layer's input norm (``SplitRows``) -> its output (times ``scale`` when given): a
    ``SplitRows`` made ready for ``next_norm`` (the next layer's input norm) when given, else [n, hidden].
    Four projection kernels around attention, as a Llama layer; a tensor input adds a row kernel in
    front (``normed_rows``), a tensor output one behind (``stream_of``)."""
    kernels = projection_kernels()
    attn = _sandwich_attention(layer, positions, stream, v_norm)
    norms = (
        layer.post_attention_layernorm,
        layer.pre_feedforward_layernorm,
        layer.post_feedforward_layernorm,
    )
    out = fused_sandwich_rest(
        attn, stream, layer.self_attn.o_proj, norms, layer.mlp, scale, next_norm
    )
    return out if next_norm is not None else kernels.stream_of(out)


def _sandwich_attention(
    layer: nn.Module, positions: torch.Tensor, stream: torch.Tensor | SplitRows, v_norm: bool
) -> torch.Tensor:
    """A sandwich layer's attention on the fused path: stream as ``sandwich_layer_fused`` takes it ->
    the attention output [n, heads * head_dim] before o_proj."""
    norm = layer.input_layernorm
    rows = stream
    if isinstance(stream, torch.Tensor):
        rows = projection_kernels().normed_rows(stream, norm.weight, norm_offset(norm))
    return attend_fused_qkv(layer.self_attn, positions, rows, norm.eps, v_norm)


def sandwich_attention_fused(
    layer: nn.Module,
    positions: torch.Tensor,
    stream: torch.Tensor | SplitRows,
    v_norm: bool = False,
) -> torch.Tensor:
    """The attention half of a sandwich layer whose MLP side is not fused (Gemma 4's MoE layers;
    ``qkv_fuses``): stream as ``sandwich_layer_fused`` takes it -> stream + post_attention_layernorm(
    attention) [n, hidden]. The q/k/v kernel, attention, o_proj and a row kernel adding the sandwich
    norm's output (``stream_of``)."""
    attn = _sandwich_attention(layer, positions, stream, v_norm)
    post = layer.post_attention_layernorm
    kernels = projection_kernels()
    return kernels.stream_of(
        kernels.project_sandwich(attn, layer.self_attn.o_proj.weight, stream, _post_norm(post))
    )


def moe_inputs_fused(layer: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gemma 4 MoE layer's two norms of the stream after attention h [n, hidden], in one row kernel ->
    (pre_feedforward_layernorm_2(h): the experts' input, the router's normalised input times its scale
    and hidden ** -0.5: ``Gemma4Router.route``'s), [n, hidden] each."""
    norm, router = layer.pre_feedforward_layernorm_2, layer.router
    return projection_kernels().norm_pair(
        h, (norm.weight, norm_offset(norm)), (router.scale, h.shape[-1] ** -0.5), norm.eps
    )


def moe_sandwich_rest_fused(
    layer: nn.Module, h: torch.Tensor, routed: torch.Tensor
) -> torch.Tensor:
    """The rest of a Gemma 4 MoE layer after attention (transformers Gemma4TextDecoderLayer): h [n,
    hidden], the stream after attention; routed [n, hidden], the experts' output -> (h +
    post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h))) +
    post_feedforward_layernorm_2(routed))) * layer_scalar. The dense MLP as a row kernel (its norm's
    preparation), gate/up and down, then one row kernel for the three norms, the add and the scale."""
    kernels, mlp, pre = projection_kernels(), layer.mlp, layer.pre_feedforward_layernorm
    rows = kernels.normed_rows(h, pre.weight, norm_offset(pre))
    act = kernels.norm_project_swiglu(rows, pre.eps, mlp.gate_up.weight, act=mlp.act)
    dense = kernels.project(act, mlp.down_proj.weight)
    post = layer.post_feedforward_layernorm
    weights = (
        layer.post_feedforward_layernorm_1.weight,
        layer.post_feedforward_layernorm_2.weight,
        post.weight,
    )
    return kernels.two_norm_tail(
        h, dense, routed, weights, post.eps, layer.layer_scalar, norm_offset(post)
    )


# ---- Step-3.5's pre-norm layer over the same attention ------------------------------------------


def gate_logits(attn: nn.Module, rows: NormedRows, eps: float) -> tuple[torch.Tensor, int] | None:
    """Step-3.5's head-wise attention gate (``g_proj``, one row per head) on rows (``NormedRows``, the
    attention's input) -> (logits [n, heads] float32, head_dim) as ``project_add_normed`` takes it, or
    None without a gate. One small projection kernel (heads x hidden weights)."""
    if getattr(attn, "g_proj", None) is None:
        return None
    logits = projection_kernels().norm_project(rows, eps, attn.g_proj.weight, torch.float32)
    return logits, attn.head_dim


def pre_norm_attention_fused(
    layer: nn.Module, positions: torch.Tensor, rows: NormedRows
) -> NormedRows:
    """The attention half of a pre-norm layer of another attention module (``qkv_fuses``; Step-3.5's:
    zero-centred norms, a head-wise sigmoid gate before o_proj): rows, the layer's input stream made
    ready for ``input_layernorm`` (``NormedRows``) -> stream + o_proj(gate * attention), made ready for
    ``post_attention_layernorm`` (``NormedRows``). The q/k/v kernel (q/k norms, RoPE, the KV write),
    the gate's kernel when there is a gate, attention, and o_proj (the gate applied per head inside
    its loop, the residual add and the next norm's preparation in its epilogue)."""
    attn, norm, post = layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm
    out = attend_fused_qkv(attn, positions, rows, norm.eps)
    return projection_kernels().project_add_normed(
        out,
        attn.o_proj.weight,
        rows.stream,
        post.weight,
        next_offset=norm_offset(post),
        gate=gate_logits(attn, rows, norm.eps),
    )


def pre_norm_mlp_fused(
    mlp: GatedMLP, mid: NormedRows, eps: float, next_norm: nn.Module | None
) -> NormedRows | torch.Tensor:
    """The MLP half of a pre-norm layer (``mlp_fuses``; a SwiGLU clamp ``mlp.limit`` when it has one):
    mid, the stream made ready for the MLP's norm (``NormedRows``; eps its norm's) -> mid + mlp, made
    ready for ``next_norm`` when given (``NormedRows``), else [n, hidden]. Two projection kernels."""
    kernels = projection_kernels()
    act = kernels.norm_project_swiglu(
        mid, eps, mlp.gate_up.weight, act=mlp.act, limit=getattr(mlp, "limit", None)
    )
    if next_norm is None:
        return kernels.project_add(act, mlp.down_proj.weight, mid.stream)
    return kernels.project_add_normed(
        act, mlp.down_proj.weight, mid.stream, next_norm.weight, next_offset=norm_offset(next_norm)
    )
