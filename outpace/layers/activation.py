"""Gated activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, both [..., intermediate]; on CUDA one Triton kernel."""
    if gate.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
        from outpace.layers.fused_kernels import silu_and_mul_triton

        return silu_and_mul_triton(gate, up)
    return silu_and_mul_torch(gate, up)


def silu_and_mul_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The reference (the CPU path, and what ``silu_and_mul_triton`` computes)."""
    return F.silu(gate) * up
