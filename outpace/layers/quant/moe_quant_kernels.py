"""Routed experts with quantized weight stacks, on the grouped-expert kernels of layers/moe_kernels.py.

The block layout (tokens' (token, slot) pairs sorted by expert into blocks, from the routing kernel or
``align``), the gate/up kernel with the activation, the down kernel with the routing weights and the
deterministic combine are moe_kernels.py's; only their weight loads change, to ``weight_tile`` of
quant_matmul_kernel.py (a constexpr format), so each chosen expert's quantized bytes are read once a block
and dequantized in registers. This file checks the stacks and hands their scales over (``ExpertScales``).

Stacks (quant/dequantize.py has the math of each format):
- block FP8 (DeepSeek-V3, Kimi-K2, Qwen3-Next-FP8): gate_up fp8 [E, 2I, H] with scale_inv [E, ceil(2I/bn),
  ceil(H/bk)] (gate rows first, as the packed bf16 stacks of layers/moe.py), down fp8 [E, H, I] with
  [E, ceil(H/bn), ceil(I/bk)]; I a multiple of bn, so that no scale block holds gate and up rows;
- INT4 groups (Kimi-K2-Thinking, compressed-tensors pack-quantized): gate_up int32 [E, 2I, H/8] with scale
  [E, 2I, H/group], down int32 [E, H, I/8] with [E, H, I/group].
Ungated experts (relu2) pass their up stack [E, I, .] as ``gate_up`` with ``gated=False``. With
``num_shared`` S the stacks' last S experts are shared experts (layers/quant/experts.py stacks a shared MLP
so), run as every token's shared slots by moe_kernels.py's shared experts fusion: their weights are views
of the stacks' last rows and their scales are read by expert index with the routed experts'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from outpace.layers.moe_kernels import BlockLayout, grouped_experts
from outpace.layers.quant.quant_matmul_kernel import INT4_PACK

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class ExpertScales:
    """The scales of quantized expert stacks, as moe_kernels.grouped_experts reads them (``quant``)."""

    fmt: str  # "fp8_block" or "int4_group"
    scale_block: tuple[int, int]  # (rows, columns) one scale covers: (bn, bk), or (1, group)
    gate_scale: torch.Tensor | None  # [E, ., .] (None: ungated)
    up_scale: torch.Tensor
    down_scale: torch.Tensor

    @property
    def pack(self) -> int:
        """Weight columns per stored element."""
        return INT4_PACK if self.fmt == "int4_group" else 1

    def block_k(self, wanted: int) -> int:
        """A K step of the kernels near ``wanted`` that the scales allow: within one fp8 scale column, or
        whole INT4 groups."""
        if self.fmt == "fp8_block":
            return min(wanted, self.scale_block[1])
        return max(wanted, self.scale_block[1])

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate's scales, up's, down's) for the kernels' pointers (up's again when ungated: not read)."""
        gate = self.up_scale if self.gate_scale is None else self.gate_scale
        return gate, self.up_scale, self.down_scale


def _expect(name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]):
    if tuple(t.shape) != shape or t.dtype not in dtypes:
        raise ValueError(
            f"{name}: expected shape {list(shape)} in {', '.join(map(str, dtypes))}, got "
            f"{list(t.shape)} {t.dtype}"
        )
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous")


def _split_rows(
    gate_up: torch.Tensor, scale: torch.Tensor, inter: int, scale_rows: int, gated: bool
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(gate, up, gate scale, up scale) views: the first ``inter`` rows are the gate's (``scale_rows`` of the
    scale's rows), the rest up's; ungated, the whole stack is up."""
    if not gated:
        return None, gate_up, None, scale
    return gate_up[:, :inter], gate_up[:, inter:], scale[:, :scale_rows], scale[:, scale_rows:]


def fp8_block_grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale_inv: torch.Tensor,
    down: torch.Tensor,
    down_scale_inv: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    activation: str = "silu",
    limit: float | None = None,
    gated: bool = True,
    layout: BlockLayout | None = None,
    skipped_slots: bool = False,
    num_shared: int = 0,
) -> torch.Tensor:
    """moe_kernels.grouped_experts over block-FP8 stacks (module docstring; the last ``num_shared`` experts
    shared): x [n, H], weights [n, top_k] (or [n, top_k + num_shared]) float32, ids [n, top_k] -> [n, H] in
    x's dtype."""
    experts, hidden, inter = down.shape
    block_n, block_k = block
    if block_k < 64 or block_k & (block_k - 1):
        raise ValueError(
            f"the fp8 kernels take blocks of a power of two >= 64 columns, not {block_k}"
        )
    if gated and inter % block_n:
        raise ValueError(
            f"packed gate/up experts of {inter} rows each share scale blocks of {block_n} rows"
        )
    rows = 2 * inter if gated else inter
    scales = (torch.float32, torch.bfloat16)
    _expect("down", down, (experts, hidden, inter), (FP8_DTYPE,))
    _expect("gate_up", gate_up, (experts, rows, hidden), (FP8_DTYPE,))
    _expect(
        "gate_up_scale_inv",
        gate_up_scale_inv,
        (experts, math.ceil(rows / block_n), math.ceil(hidden / block_k)),
        scales,
    )
    _expect(
        "down_scale_inv",
        down_scale_inv,
        (experts, math.ceil(hidden / block_n), math.ceil(inter / block_k)),
        scales,
    )
    gate, up, gate_scale, up_scale = _split_rows(
        gate_up, gate_up_scale_inv, inter, inter // block_n, gated
    )
    quant = ExpertScales("fp8_block", tuple(block), gate_scale, up_scale, down_scale_inv)
    return _grouped(
        x, weights, ids, gate, up, down, activation, limit, layout, skipped_slots, quant, num_shared
    )


def int4_group_grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
    group: int = 32,
    activation: str = "silu",
    limit: float | None = None,
    gated: bool = True,
    layout: BlockLayout | None = None,
    skipped_slots: bool = False,
    num_shared: int = 0,
) -> torch.Tensor:
    """moe_kernels.grouped_experts over INT4 stacks (module docstring; the last ``num_shared`` experts
    shared): x [n, H], weights [n, top_k] (or [n, top_k + num_shared]) float32, ids [n, top_k] -> [n, H] in
    x's dtype."""
    experts, hidden = down.shape[:2]
    inter = down.shape[2] * INT4_PACK
    if group < INT4_PACK or group & (group - 1):
        raise ValueError(
            f"the INT4 kernels take groups of a power of two >= 8 columns, not {group}"
        )
    if hidden % group or inter % group:
        raise ValueError(
            f"hidden ({hidden}) and inter ({inter}) must be multiples of the group ({group})"
        )
    rows = 2 * inter if gated else inter
    scales = (torch.float32, torch.bfloat16)
    _expect("down", down, (experts, hidden, inter // INT4_PACK), (torch.int32,))
    _expect("gate_up", gate_up, (experts, rows, hidden // INT4_PACK), (torch.int32,))
    _expect("gate_up_scale", gate_up_scale, (experts, rows, hidden // group), scales)
    _expect("down_scale", down_scale, (experts, hidden, inter // group), scales)
    gate, up, gate_scale, up_scale = _split_rows(gate_up, gate_up_scale, inter, inter, gated)
    quant = ExpertScales("int4_group", (1, group), gate_scale, up_scale, down_scale)
    return _grouped(
        x, weights, ids, gate, up, down, activation, limit, layout, skipped_slots, quant, num_shared
    )


def _grouped(
    x, weights, ids, gate, up, down, activation, limit, layout, skipped_slots, quant, num_shared
) -> torch.Tensor:
    """moe_kernels.grouped_experts over the stacks, their last ``num_shared`` experts the shared ones (views
    of the stacks' last rows; the scales stay whole: the kernels read them by expert index)."""
    shared = None
    if num_shared:
        routed = down.shape[0] - num_shared
        shared = (None if gate is None else gate[routed:], up[routed:], down[routed:])
        gate, up, down = (None if gate is None else gate[:routed]), up[:routed], down[:routed]
    return grouped_experts(
        x,
        weights,
        ids,
        gate,
        up,
        down,
        activation,
        limit,
        layout=layout,
        skipped_slots=skipped_slots,
        quant=quant,
        shared=shared,
    )
