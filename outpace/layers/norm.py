"""RMSNorm, computed in float32 and cast back (as Llama and Qwen do) or with the weight applied in float32
before the cast (Gemma, Qwen3-Next, Nemotron-H, Step-3.5), optionally fused with the residual add in front
of it (vLLM's ``fused_add_rms_norm``): on CUDA one Triton kernel does both."""

from __future__ import annotations

from typing import overload

import torch
from torch import nn


def rms_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., dim] (+ residual [..., dim]) -> (RMSNorm of s, s) [..., dim] each, where s = x + residual
    (x itself without a residual). The reference: the CPU path, and what ``rms_norm_triton`` computes."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype), x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    @overload
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, x, residual=None):
        """x [..., dim] -> RMSNorm(x) [..., dim]; with residual [..., dim] -> (RMSNorm(x + residual),
        x + residual): the residual add and the norm after it in one step."""
        if x.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
            from outpace.layers.fused_kernels import rms_norm_triton as rms_norm
        else:
            rms_norm = rms_norm_torch
        normed, stream = rms_norm(x, self.weight, self.eps, residual)
        return normed if residual is None else (normed, stream)


def rms_norm_f32(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float = 0.0
) -> torch.Tensor:
    """x [..., dim] -> its RMSNorm times (offset + weight) [dim], all in float32, cast back at the end
    (``RMSNorm`` casts before the weight multiplies); no weight: the bare normalisation."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        xf = xf * (offset + weight.float())
    return xf.to(x.dtype)


class Float32RMSNorm(nn.Module):
    """RMSNorm with the weight applied in float32 before the cast back (``rms_norm_f32``), as Gemma's are.

    ``offset`` 1.0: the scale is 1 + weight, the weight stored around 0 (transformers Gemma3RMSNorm);
    0.0: the plain weight (Gemma4RMSNorm). ``with_weight`` False: no parameter at all, the bare
    normalisation (Gemma4RMSNorm(with_scale=False), Gemma 4's v norm and router norm)."""

    def __init__(
        self, dim: int, eps: float = 1e-6, offset: float = 0.0, with_weight: bool = True
    ) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        # at initialisation the scale is 1
        self.register_parameter(
            "weight", nn.Parameter(torch.full((dim,), 1.0 - offset)) if with_weight else None
        )

    @overload
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, x, residual=None):
        """x [..., dim] -> [..., dim]; with residual [..., dim] -> (the norm of x + residual, x + residual),
        as ``RMSNorm``'s. On CUDA (no autograd) one Triton kernel, residual add included."""
        if x.is_cuda and not torch.is_grad_enabled():
            from outpace.layers.fused_kernels import rms_norm_triton

            normed, stream = rms_norm_triton(x, self.weight, self.eps, residual, self.offset)
            return normed if residual is None else (normed, stream)
        if residual is None:
            return rms_norm_f32(x, self.weight, self.eps, self.offset)
        stream = x + residual
        return rms_norm_f32(stream, self.weight, self.eps, self.offset), stream
