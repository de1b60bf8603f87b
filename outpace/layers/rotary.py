"""Rotary position embedding (neox layout: rotate halves), with llama3 and linear scaling."""
from __future__ import annotations

import math

import torch
from torch import nn


def _inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = old_len / low, old_len / high
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > low_wavelen, inv_freq / factor,
                               torch.where(wavelen < high_wavelen, inv_freq, smoothed))
    return inv_freq.float()


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at arbitrary (e.g. tree-depth) positions from a cached table."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None = None) -> None:
        super().__init__()
        inv_freq = _inverse_frequencies(head_dim, theta, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)  # [max_positions, head_dim // 2]
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [num_tokens]; q [num_tokens, heads, head_dim]; k [num_tokens, kv_heads, head_dim]
        -> rotated (q, k), new tensors. On CUDA one Triton kernel rotates both."""
        if q.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
            from outpace.layers.fused_kernels import rotary_triton as rotary
        else:
            rotary = rotary_torch
        return rotary(positions, q, k, self.cos, self.sin)


def rotary_torch(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference (the CPU path, and what ``rotary_triton`` computes): positions [n];
    q [n, heads, head_dim], k [n, kv_heads, head_dim]; cos, sin [max_positions, head_dim // 2]
    float32 tables -> rotated (q, k) in their dtypes, float32 math."""
    cos = cos.index_select(0, positions).unsqueeze(1)  # [n, 1, head_dim // 2]
    sin = sin.index_select(0, positions).unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
