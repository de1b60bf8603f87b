"""Routed experts with quantized weight stacks, on the grouped-expert kernels of layers/moe_kernels.py.

The block layout (tokens' (token, slot) pairs sorted by expert into blocks, from the routing kernel or
``align``), the gate/up kernel with the activation, the down kernel with the routing weights and the
deterministic combine are moe_kernels.py's; only their weight loads change (a constexpr format), so each
chosen expert's quantized bytes are read once a block, each tile dequantized in registers by ``weight_tile``
of quant_matmul_kernel.py (moe_kernels.py ``_add_product``). This file checks the stacks and hands their
scales over (``ExpertScales``).

Stacks (quant/dequantize.py has the math of each format):
- block FP8 (DeepSeek-V3, Kimi-K2, Qwen3-Next-FP8): gate_up fp8 [E, 2I, H] with scale_inv [E, ceil(2I/bn),
  ceil(H/bk)] (gate rows first, as the packed bf16 stacks of layers/moe.py), down fp8 [E, H, I] with
  [E, ceil(H/bn), ceil(I/bk)]; I a multiple of bn, so that no scale block holds gate and up rows;
- INT4 groups (Kimi-K2-Thinking, compressed-tensors pack-quantized): gate_up int32 [E, 2I, H/8] with scale
  [E, 2I, H/group], down int32 [E, H, I/8] with [E, H, I/group].
Ungated experts (relu2) pass their up stack [E, I, .] as ``gate_up`` with ``gated=False``. The scales may have
any strides (per-tensor FP8 read as blocks repeats each expert's scale by stride-0 views:
layers/quant/experts.py ``QuantizedExpertStacks.tensor_input_blocks``).

A shared MLP quantized as the experts are and S experts wide (``shared``: layers/quant/experts.py
``quantized_shared_stacks``) runs as every token's S shared slots of moe_kernels.py's shared experts fusion,
from views of its own tensors: its weights as the half-precision path's (gate and up [S, I, .], down
[S, H, I(/8)] of strides (I(/8), S * I(/8), 1)) and its scales alike (block FP8 gate and up [S, I/bn, .],
down [S, ceil(H/bn), I/bk] of strides (I/bk, S * I/bk, 1); INT4 down [S, H, I/group]), each of one routed
expert's shape and of the routed scales' column stride; the kernels pick a slot's scale rows from the routed
stacks or these as they pick its weight rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from outpace.layers.expert_blocks import BlockLayout
from outpace.layers.grouped_experts import grouped_experts
from outpace.layers.moe_kernels import Tiles
from outpace.layers.normed_rows import NormedRows
from outpace.layers.quant.weight_tiles import INT4_PACK

if TYPE_CHECKING:
    from outpace.layers.quant.experts import QuantizedShared

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class ExpertScales:
    """The scales of quantized expert stacks, as grouped_experts.grouped_experts reads them (``quant``)."""

    fmt: str  # "fp8_block" or "int4_group"
    scale_block: tuple[int, int]  # (rows, columns) one scale covers: (bn, bk), or (1, group)
    gate_scale: torch.Tensor | None  # [E, ., .] (None: ungated)
    up_scale: torch.Tensor
    down_scale: torch.Tensor
    # the shared experts' (gate or None, up, down) scales [S, ., .], views of their MLP's own (None: none)
    shared: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None

    @property
    def pack(self) -> int:
        """Weight columns per stored element."""
        return INT4_PACK if self.fmt == "int4_group" else 1

    def block_k(self, wanted: int) -> int:
        """A K step of the kernels near ``wanted`` that the scales allow: whole fp8 scale columns or a part
        of one (``weight_tile``), whole INT4 groups."""
        if self.fmt == "fp8_block":
            bk = self.scale_block[1]
            return wanted if wanted % bk == 0 else min(wanted, bk)
        return max(wanted, self.scale_block[1])

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate's scales, up's, down's) for the kernels' pointers (up's again when ungated: not read)."""
        gate = self.up_scale if self.gate_scale is None else self.gate_scale
        return gate, self.up_scale, self.down_scale

    def shared_stacks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The shared experts' (gate, up, down) scales likewise (the routed ones' without shared experts:
        not read)."""
        if self.shared is None:
            return self.stacks()
        gate, up, down = self.shared
        return up if gate is None else gate, up, down


def _expect(
    name: str,
    t: torch.Tensor,
    shape: tuple[int, ...],
    dtypes: tuple[torch.dtype, ...],
    contiguous_rows: bool = True,
):
    """t of ``shape`` in one of ``dtypes``; a weight's rows contiguous (a scale's may have any strides)."""
    if tuple(t.shape) != shape or t.dtype not in dtypes:
        raise ValueError(
            f"{name}: expected shape {list(shape)} in {', '.join(map(str, dtypes))}, got "
            f"{list(t.shape)} {t.dtype}"
        )
    if contiguous_rows and t.stride(-1) != 1:
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
    shared: QuantizedShared | None = None,
    tiles: tuple[Tiles, Tiles] | None = None,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor | NormedRows:
    """grouped_experts.grouped_experts over block-FP8 stacks (module docstring), with ``shared``'s slots: x
    [n, H], weights [n, top_k] (or [n, top_k + S]) float32, ids [n, top_k] -> [n, H] in x's dtype.
    ``tiles``: the kernels' tiles forced; ``ready``, ``row_scale``: the fused residual stack's (grouped_experts,
    which then returns ``NormedRows``)."""
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
        contiguous_rows=False,
    )
    _expect(
        "down_scale_inv",
        down_scale_inv,
        (experts, math.ceil(hidden / block_n), math.ceil(inter / block_k)),
        scales,
        contiguous_rows=False,
    )
    gate, up, gate_scale, up_scale = _split_rows(
        gate_up, gate_up_scale_inv, inter, inter // block_n, gated
    )
    quant = ExpertScales("fp8_block", tuple(block), gate_scale, up_scale, down_scale_inv)
    return _grouped(
        x,
        weights,
        ids,
        gate,
        up,
        down,
        activation,
        limit,
        layout,
        skipped_slots,
        quant,
        shared,
        tiles,
        ready,
        row_scale,
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
    shared: QuantizedShared | None = None,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor | NormedRows:
    """grouped_experts.grouped_experts over INT4 stacks (module docstring), with ``shared``'s slots: x [n, H],
    weights [n, top_k] (or [n, top_k + S]) float32, ids [n, top_k] -> [n, H] in x's dtype; ``ready``,
    ``row_scale`` as ``fp8_block_grouped_experts``'."""
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
    _expect("gate_up_scale", gate_up_scale, (experts, rows, hidden // group), scales, False)
    _expect("down_scale", down_scale, (experts, hidden, inter // group), scales, False)
    gate, up, gate_scale, up_scale = _split_rows(gate_up, gate_up_scale, inter, inter, gated)
    quant = ExpertScales("int4_group", (1, group), gate_scale, up_scale, down_scale)
    return _grouped(
        x, weights, ids, gate, up, down, activation, limit, layout, skipped_slots, quant, shared,
        ready=ready, row_scale=row_scale,
    )  # fmt: skip


def _grouped(
    x,
    weights,
    ids,
    gate,
    up,
    down,
    activation,
    limit,
    layout,
    skipped_slots,
    quant,
    shared,
    tiles=None,
    ready=None,
    row_scale=None,
) -> torch.Tensor | NormedRows:
    """grouped_experts.grouped_experts over the routed stacks, with the shared MLP's slots (views of its own
    weights and scales) when ``shared`` is given: its scales of one routed expert's shape and dtype each (the
    kernels take a slot's scales from either by the same pointer type) and, where a scale row has more than
    one column, of the routed scales' column stride (the kernels read both with it)."""
    if shared is not None:
        routed = (quant.gate_scale, quant.up_scale, quant.down_scale)
        for name, mine, theirs in zip(("gate", "up", "down"), shared.scales, routed):
            if (mine is None) != (theirs is None):
                raise ValueError("shared experts fuse with routed ones of their own gating")
            if mine is None:
                continue
            if mine.shape[1:] != theirs.shape[1:] or mine.dtype != theirs.dtype:
                raise ValueError(
                    f"the shared {name} scale: expected [S, {', '.join(map(str, theirs.shape[1:]))}] "
                    f"in {theirs.dtype}, got {list(mine.shape)} in {mine.dtype}"
                )
            if mine.shape[-1] > 1 and mine.stride(-1) != theirs.stride(-1):
                raise ValueError(
                    f"the shared {name} scale: column stride {mine.stride(-1)}, the routed scales' "
                    f"is {theirs.stride(-1)}"
                )
        quant = replace(quant, shared=shared.scales)
    return grouped_experts(
        x,
        weights,
        ids,
        gate,
        up,
        down,
        activation,
        limit,
        tiles,
        layout=layout,
        skipped_slots=skipped_slots,
        quant=quant,
        shared=None if shared is None else shared.weights,
        ready=ready,
        row_scale=row_scale,
    )
