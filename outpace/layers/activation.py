"""Gated activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, both [..., intermediate]."""
    return F.silu(gate) * up
