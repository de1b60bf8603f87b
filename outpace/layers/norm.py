"""RMSNorm, computed in float32 and cast back (as Llama and Qwen do), optionally fused with the
residual add in front of it (vLLM's ``fused_add_rms_norm``): on CUDA one Triton kernel does both."""
from __future__ import annotations

from typing import overload

import torch
from torch import nn


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, x, residual=None):
        """x [..., dim] -> RMSNorm(x) [..., dim]; with residual [..., dim] -> (RMSNorm(x + residual),
        x + residual): the residual add and the norm after it in one step."""
        if x.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
            from outpace.layers.fused_kernels import rms_norm_triton as rms_norm
        else:
            rms_norm = rms_norm_torch
        normed, stream = rms_norm(x, self.weight, self.eps, residual)
        return normed if residual is None else (normed, stream)
