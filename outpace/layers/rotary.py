"""Rotary position embedding (neox layout: rotate halves), with llama3 and linear scaling, and Gemma 4's
proportional partial rotation."""

from __future__ import annotations

import math

import torch
from torch import nn


def _inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind == "proportional":
        # transformers _compute_proportional_rope_parameters (Gemma 4): the first
        # int(partial_rotary_factor * head_dim // 2) frequencies keep their exponents over the whole head_dim,
        # the others are 0 (those dimension pairs pass unrotated); all divided by ``factor``.
        rotated = int(scaling.get("partial_rotary_factor", 1.0) * head_dim // 2)
        inv_freq[rotated:] = 0.0
        inv_freq = inv_freq / scaling.get("factor", 1.0)
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = old_len / low, old_len / high
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(
            wavelen > low_wavelen,
            inv_freq / factor,
            torch.where(wavelen < high_wavelen, inv_freq, smoothed),
        )
    elif kind == "yarn":
        inv_freq = _yarn_inverse_frequencies(inv_freq, head_dim, theta, scaling)
    return inv_freq.float()


def _yarn_inverse_frequencies(
    inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: dict
) -> torch.Tensor:
    """YaRN (transformers _compute_yarn_parameters, DeepSeek's DeepseekV3YarnRotaryEmbedding): frequencies
    below the correction range are interpolated (divided by ``factor``), those above it kept, a linear ramp
    between. inv_freq [head_dim // 2] float64, unscaled."""
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(
        rotations: float,
    ) -> float:  # the dimension that turns ``rotations`` times over old_len
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = (
        (torch.arange(head_dim // 2, dtype=torch.float64) - low)
        / (high - low if high != low else 0.001)
    ).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature term (transformers yarn_get_mscale): 0.1 * mscale * ln(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: dict | None) -> float:
    """What the cos and sin tables are multiplied by (transformers' ``attention_scaling``): for YaRN the
    config's ``attention_factor``, else yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    when both are given, else yarn_mscale(factor); 1 for every other kind."""
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = (
        scaling["factor"],
        scaling.get("mscale"),
        scaling.get("mscale_all_dim"),
    )
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


# Positions past the model's context that a table also covers: a verify near the end of the context places its
# draft nodes there (the engine keeps a request's drafts within this many rows past its last token, so the
# context is not shortened by them; no token at those positions is ever emitted).
POSITIONS_PAST_CONTEXT = 64


def query_scales(positions: torch.Tensor, beta: float, original_length: int) -> torch.Tensor:
    """Ministral 3's query temperature by position (transformers ministral3 ``get_llama_4_attn_scale``, from
    Llama 4): 1 + beta * ln(1 + floor(position / original_length)), original_length rope_parameters'
    ``original_max_position_embeddings``; 1 below it. positions [n] float32 -> [n] float32."""
    return 1 + beta * torch.log(1 + torch.floor(positions / original_length))


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at arbitrary (e.g. tree-depth) positions from a cached table."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict | None = None,
        interleaved: bool = False,
        query_scaling: tuple[float, int] | None = None,
    ) -> None:
        """``interleaved``: dimension pairs (0, 1), (2, 3), ... rotate together (DeepSeek's layout,
        transformers apply_rotary_pos_emb_interleave); the rotated result comes out in the halves layout
        (even dimensions, then odd ones), as transformers' does: q.k is the same under any permutation
        applied to both. ``query_scaling`` (beta, original length): the rotated q is also multiplied by
        ``query_scales`` at its position (Ministral 3's ``llama_4_scaling_beta``)."""
        super().__init__()
        inv_freq = _inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions + POSITIONS_PAST_CONTEXT, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        factor = rope_attention_factor(scaling)
        # [max_positions + POSITIONS_PAST_CONTEXT, head_dim // 2]
        self.register_buffer("cos", angles.cos() * factor, persistent=False)
        self.register_buffer("sin", angles.sin() * factor, persistent=False)
        # [max_positions + POSITIONS_PAST_CONTEXT] or None (the fused q/k/v kernels rotate by the tables alone:
        # layers/fused_decoder.py ``project_fused`` scales their q by ``scale_queries``)
        query_scale = None if query_scaling is None else query_scales(positions, *query_scaling)
        self.register_buffer("query_scale", query_scale, persistent=False)
        self.interleaved = interleaved

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [num_tokens]; q [num_tokens, heads, head_dim]; k [num_tokens, kv_heads, head_dim]
        -> rotated (q, k), new tensors. A head_dim wider than the table's rotated dimensions (partial
        rotary: Qwen3-Next, Step-3.5) rotates its leading ones and passes the others through. On CUDA
        one Triton kernel rotates both."""
        if self.interleaved:  # [..., head_dim]: the even dimensions, then the odd ones
            if q.shape[-1] != 2 * self.cos.shape[-1]:
                raise ValueError("RotaryEmbedding: interleaved pairs rotate whole heads only")
            q, k = (torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1) for x in (q, k))
        if q.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
            from outpace.layers.fused_kernels import rotary_triton as rotary
        else:
            rotary = rotary_torch
        q, k = rotary(positions, q, k, self.cos, self.sin)
        return self.scale_queries(q, positions), k

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rotated q [num_tokens, ...] times its position's ``query_scale`` (in q's dtype, as transformers
        multiplies); q itself without one."""
        scale = self.query_scales_at(positions, q.dtype)  # [num_tokens]
        return q if scale is None else q * scale.view(-1, *(1,) * (q.dim() - 1))

    def query_scales_at(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """positions [num_tokens] -> their ``query_scale`` entries [num_tokens] in ``dtype``; None without
        a query scale."""
        if self.query_scale is None:
            return None
        return self.query_scale.index_select(0, positions).to(dtype)


def rotary_torch(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference (the CPU path, and what ``rotary_triton`` computes): positions [n];
    q [n, heads, head_dim], k [n, kv_heads, head_dim]; cos, sin [max_positions, rotary_dim // 2]
    float32 tables, rotary_dim <= head_dim -> (q, k) in their dtypes, the first rotary_dim dimensions
    rotated in float32 math, the others passed through."""
    cos = cos.index_select(0, positions).unsqueeze(1)  # [n, 1, rotary_dim // 2]
    sin = sin.index_select(0, positions).unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = 2 * cos.shape[-1]  # the rotated dimensions
    x1, x2 = x[..., :r].float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return rotated if r == x.shape[-1] else torch.cat((rotated, x[..., r:]), dim=-1)
