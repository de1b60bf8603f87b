"""The norms and adds around a sandwich layer's MLP (Gemma 4's, transformers Gemma4TextDecoderLayer), each
group one launch on CUDA (layers/sandwich_norm_kernels.py) where torch takes one per norm and per add:

- ``after_attention``: h + post_attention_norm(attn), and the norm(s) the MLP (and the MoE block) read of
  that sum: pre_feedforward_layernorm (and pre_feedforward_layernorm_2);
- ``after_mlp``: (h + post_feedforward_layernorm(m)) * scale, where m is the MLP's output or, beside a
  MoE block, post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(routed); ``scale`` the
  layer's ``layer_scalar`` (None: not applied here).

Every norm is a ``Float32RMSNorm`` (layers/norm.py: the weight applied in float32, offset + weight, then
cast). The kernels compute in float32 with the roundings of the torch path (each function's, the CPU path
and the reference): each norm's output and each sum rounded to the stream's dtype, as the separate
torch kernels round them.
"""

from __future__ import annotations

import torch

from outpace.layers.norm import Float32RMSNorm


def fuses(x: torch.Tensor) -> bool:
    """Whether the kernels serve x (CUDA, no autograd: they have no backward)."""
    return x.is_cuda and not torch.is_grad_enabled()


def after_attention(
    h: torch.Tensor,
    attn: torch.Tensor,
    post: Float32RMSNorm,
    pre: Float32RMSNorm,
    pre2: Float32RMSNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """h, attn [n, dim] -> (h + post(attn), pre of it, pre2 of it or None) [n, dim] each (module
    docstring): one launch on CUDA, else the torch ops (the reference)."""
    if fuses(h):
        from outpace.layers.sandwich_norm_kernels import after_attention_triton  # (CUDA installs)

        return after_attention_triton(h, attn, post, pre, pre2)
    h = h + post(attn)
    return h, pre(h), None if pre2 is None else pre2(h)


def after_mlp(
    h: torch.Tensor,
    mlp: torch.Tensor,
    post: Float32RMSNorm,
    scale: torch.Tensor | None = None,
    routed: torch.Tensor | None = None,
    post1: Float32RMSNorm | None = None,
    post2: Float32RMSNorm | None = None,
    next_norm: Float32RMSNorm | None = None,
):
    """h, mlp [n, dim] (and the MoE block's ``routed`` [n, dim] with its norms ``post1``, ``post2``) ->
    (h + post(m)) * scale [n, dim] (module docstring; ``scale`` [1] or None), made ready for ``next_norm``
    when given (the next layer's input norm, read by its fused projection: layers/fused_projection.py
    ``NormedRows``): one launch on CUDA, else the torch ops (the reference; with ``next_norm`` the rows
    kernel of the fused projections, which the CPU runs in Triton's interpreter)."""
    if fuses(h):
        from outpace.layers.sandwich_norm_kernels import after_mlp_triton  # (CUDA installs)

        return after_mlp_triton(h, mlp, post, scale, routed, post1, post2, next_norm)
    if routed is not None:
        mlp = post1(mlp) + post2(routed)
    h = h + post(mlp)
    h = h if scale is None else h * scale
    if next_norm is None:
        return h
    from outpace.layers.normed_rows import normed_rows  # (imports Triton)

    return normed_rows(h, next_norm.weight, next_norm.offset)
