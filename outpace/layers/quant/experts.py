"""Routed experts stored quantized, and the stacked layout the GPU grouped kernels read.

Per-expert checkpoints (DeepSeek-V3/R1, Kimi-K2 FP8 and Kimi-K2-Thinking INT4, Qwen3-Next-FP8:
``mlp.experts.{e}.{gate,up,down}_proj`` each with its own scale) load as one ``QuantizedLinear`` per
projection of each expert's MLP module (layers/quant/loading.py). layers/moe.py ``RoutedExperts`` then runs
them eagerly (``uses_kernels`` declines them): on the CPU each projection dequantizes, on CUDA each calls the
few-row kernels of layers/quant/fp8_linear_kernel.py / int4_linear_kernel.py.

The grouped kernels over quantized experts (layers/quant/moe_quant_kernels.py) read ``quantized_stacks``:
- block FP8: gate_up float8_e4m3fn [E, 2 * I, H] (each expert's gate rows, then its up rows) with scale_inv
  [E, ceil(2I/bn), ceil(H/bk)], down [E, H, I] with [E, ceil(H/bn), ceil(I/bk)] (I a multiple of bn, so that
  gate and up do not share a block: true of every published layout, 128 | 2048, 1536, 512);
- INT4 groups: gate_up int32 [E, 2 * I, H / 8] with scale [E, 2 * I, H / group], down [E, H, I / 8] with
  [E, H, I / group] (compressed-tensors packing: dequantize.py);
- per-tensor FP8: gate_up [E, 2 * I, H], down [E, H, I] with one scale per expert and projection: gate_up
  scale [E, 2] (gate, up), down [E].
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.layers.quant.linear import QuantizedLinear


def has_quantized_experts(experts: nn.Module) -> bool:
    """Whether a ``RoutedExperts``' per-expert modules hold quantized projections."""
    per_expert = getattr(experts, "per_expert", None)
    return bool(per_expert) and isinstance(
        getattr(per_expert[0], "down_proj", None), QuantizedLinear
    )


def quantized_stacks(
    experts: nn.Module,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((gate_up weight, its scale), (down weight, its scale)) of gated per-expert quantized experts, in the
    layout of the module docstring (new tensors: a copy of the stored bytes, to be made once and kept)."""
    modules = experts.per_expert
    gate_up = torch.stack(
        [torch.cat([m.gate_proj.stored_weight, m.up_proj.stored_weight]) for m in modules]
    )
    down = torch.stack([m.down_proj.stored_weight for m in modules])
    if modules[0].down_proj.scale.dim() == 0:  # per-tensor: [E, 2] and [E]
        gate_up_scale = torch.stack(
            [torch.stack([m.gate_proj.scale, m.up_proj.scale]) for m in modules]
        )
    else:
        gate_up_scale = torch.stack(
            [torch.cat([m.gate_proj.scale, m.up_proj.scale]) for m in modules]
        )
    down_scale = torch.stack([m.down_proj.scale for m in modules])
    return (gate_up, gate_up_scale), (down, down_scale)
