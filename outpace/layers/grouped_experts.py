"""``grouped_experts``: the launcher of the grouped-expert kernels (layers/moe_kernels.py, whose docstring
says what they compute and how: the block layout or pairs apart, the few-token and one-token tiles, shared
experts fused, the quantized stacks, the combine that readies the next norm). Three launches, no host
synchronisation: gate/up, down, and the combine of a token's slots; ``align``'s before them where the routing
kernel did not write the layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton

from outpace.attention.context import batch_invariant
from outpace.layers import moe_kernels
from outpace.layers.expert_blocks import BlockLayout, align, block_rows
from outpace.layers.moe_kernels import (
    ACTIVATIONS,
    Tiles,
    expert_combine_kernel,
    expert_down_kernel,
    expert_gate_up_kernel,
    expert_tiles,
    one_token_rows,
    one_token_tiles,
    pairs_apart,
)
from outpace.layers.normed_rows import NormedRows
from outpace.layers.pdl import pdl_available, pdl_launch_options
from outpace.layers.quant.quant_matmul_kernel import row_group
from outpace.layers.sm_count import num_sms

if TYPE_CHECKING:
    from outpace.layers.quant.moe_quant_kernels import ExpertScales


def _combine_block(tokens: int, hidden: int, device: torch.device) -> int:
    """Columns a program of ``expert_combine_kernel`` sums: about two programs an SM, 128 at least, 1024 at most (at
    one token of DeepSeek-V2-Lite, 2048 columns in 16 programs, where 1024-column blocks left 2 programs
    loading every slot's row one after another). Counted over the tokens' power of two: a compile-time value
    per token bucket, which the engine's warm-up meets (engine/warm_up.py). In batch-invariant mode one token's
    at every count: the block sets the parts of a ``NormedRows``' sums of squares (``ready``), and so the bits
    of the next norm's factor, which must not follow the batch."""
    tokens = 1 if batch_invariant() else tokens
    per_program = triton.cdiv(triton.next_power_of_2(tokens) * hidden, 2 * num_sms(device))
    return max(128, min(1024, triton.next_power_of_2(per_program)))


@dataclass(frozen=True)
class _ExpertSizes:
    """The sizes a ``grouped_experts`` call runs over."""

    tokens: int
    hidden: int
    inter: int  # weight columns of the down stack (INT4: its stored columns times the pack)
    top_k: int
    num_routed: int
    num_shared: int

    @property
    def slots(self) -> int:
        """A token's (token, slot) pairs: its top_k routed slots, then its shared ones."""
        return self.top_k + self.num_shared

    @property
    def pairs(self) -> int:
        """The (token, slot) pairs of all tokens: pair p = token * slots + slot."""
        return self.tokens * self.slots


def _expert_sizes(
    x: torch.Tensor,
    ids: torch.Tensor,
    down: torch.Tensor,
    shared: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None,
    quant: ExpertScales | None,
) -> _ExpertSizes:
    """The sizes of ``grouped_experts``' arguments."""
    tokens, hidden = x.shape
    return _ExpertSizes(
        tokens=tokens,
        hidden=hidden,
        inter=down.shape[2] * (quant.pack if quant else 1),
        top_k=ids.shape[1],
        num_routed=down.shape[0],
        num_shared=0 if shared is None else shared[1].shape[0],
    )


def _refuse_bad_expert_inputs(
    sizes: _ExpertSizes,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate: torch.Tensor | None,
    up: torch.Tensor,
    down: torch.Tensor,
    activation: str,
    limit: float | None,
    shared: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None,
    quant: ExpertScales | None,
    shared_input: torch.Tensor | None,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None,
    row_scale: torch.Tensor | None,
) -> None:
    """Raises ValueError for arguments ``grouped_experts`` does not compute (its docstring)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"grouped experts compute {', '.join(ACTIVATIONS)}, not {activation!r}")
    if gate is None and limit is not None:
        raise ValueError("the clamp limit applies to gated experts only")
    shared_gate, shared_up, shared_down = shared or (gate, up, down)
    if quant is not None and (shared is None) != (quant.shared is None):
        raise ValueError("quantized shared experts come with their scales (ExpertScales.shared)")
    if shared is not None and (
        shared_up.shape[1:] != up.shape[1:]
        or shared_down.shape[1:] != down.shape[1:]
        or shared_up.dtype != up.dtype
        or (shared_gate is None) != (gate is None)
    ):
        raise ValueError(
            "shared experts fuse with routed ones of their own shape, dtype and gating"
        )
    for w in (gate, up, down, shared_gate, shared_up, shared_down, ids, weights):
        assert w is None or w.stride(-1) == 1
    top_k, slots, n = sizes.top_k, sizes.slots, sizes.tokens
    if weights.shape[1] not in (top_k, slots):
        raise ValueError(
            f"weights of {weights.shape[1]} slots a token: the {top_k} routed ones, or all {slots}"
        )
    if row_scale is not None and (shared_input is not None or row_scale.shape != (n,)):
        raise ValueError(f"a row scale of [{n}] tokens, for x and the shared slots alike")
    if ready is not None and shared_input is not None:
        raise ValueError(
            "the experts' output comes apart from the shared slots' (shared_input): no stream"
        )
    added = () if ready is None else (("stream", ready[0]), ("addend", (*ready, None)[3]))
    for name, t in added:
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype):
            raise ValueError(
                f"the {name} {tuple(t.shape)} {t.dtype} the experts' output is added to: "
                f"{tuple(x.shape)} {x.dtype}, as their output"
            )
    if shared_input is not None and (
        sizes.num_shared == 0 or shared_input.shape != x.shape or shared_input.dtype != x.dtype
    ):
        raise ValueError(
            f"shared_input {tuple(shared_input.shape)} {shared_input.dtype}: the rows of the shared "
            f"slots, as x's {tuple(x.shape)} {x.dtype}, with shared experts to read them"
        )


@dataclass(frozen=True)
class _KernelTiles:
    """One expert kernel's tiling as launched: its tiles, K step, rows read a block and their grouping."""

    block_n: int
    block_k: int  # the tiles' K step as the scales allow it (``ExpertScales.block_k``)
    warps: int
    stages: int
    rows: int  # ROWS: 1 (a block's one row on the CUDA cores) or BLOCK_M
    group: int  # GROUP (quant_matmul_kernel.py ``row_group``)
    k_tiled: bool  # K_TILED: the kernel's K (gate/up: hidden, down: inter) a multiple of block_k


@dataclass(frozen=True)
class _ExpertPlan:
    """How ``grouped_experts``' kernels cover the (token, slot) pairs: program rows, format and tiles."""

    sizes: _ExpertSizes
    fmt: str  # "none" or the quantized format
    scale_bn: int  # rows and columns one scale covers (1, 1 over half-precision stacks)
    scale_bk: int
    apart: bool  # a program row a pair (module docstring, PAIRS APART), no layout read
    blocks: int  # program rows: the layout's blocks, or the pairs
    block_m: int  # intermediate rows a program row: the layout's BLOCK_M, or 1
    sorted_pairs: torch.Tensor  # the layout's (ids when apart: not read)
    block_expert: torch.Tensor  # the layout's (ids when apart: not read)
    gate_up: _KernelTiles
    down: _KernelTiles
    precision: str  # tl.dot's: "ieee" over float32 (Triton's interpreter, tests), else "tf32"
    pdl: bool  # launched with programmatic dependent launch (layers/pdl.py)


def _choose_tiles(
    tokens: int, fmt: str, fp32: bool, up_one_row: bool, down_one_row: bool
) -> tuple[Tiles, Tiles]:
    """Each kernel's tiles: ``one_token_tiles``' where it reads one row a block, else ``expert_tiles``'."""
    up_tiles, down_tiles = expert_tiles(block_rows(tokens), fp32, fmt)
    one_up, one_down = one_token_tiles(fmt)
    return (one_up if up_one_row else up_tiles), (one_down if down_one_row else down_tiles)


def _kernel_tiles(
    tiles: Tiles,
    one_row: bool,
    k: int,
    block_m: int,
    fmt: str,
    scale_bk: int,
    quant: ExpertScales | None,
) -> _KernelTiles:
    """A kernel's ``tiles`` as launched over ``k`` columns, one row a block (``one_row``) or ``block_m``."""
    block_n, block_k, warps, stages = tiles
    block_k = block_k if quant is None else quant.block_k(block_k)
    return _KernelTiles(
        block_n=block_n,
        block_k=block_k,
        warps=warps,
        stages=stages,
        rows=1 if one_row else block_m,
        group=row_group(block_k, fmt, scale_bk),
        k_tiled=k % block_k == 0,
    )


def _plan_experts(
    sizes: _ExpertSizes,
    x: torch.Tensor,
    ids: torch.Tensor,
    layout: BlockLayout | None,
    quant: ExpertScales | None,
    tiles: tuple[Tiles, Tiles] | None,
) -> _ExpertPlan:
    """The program rows (pairs apart, or the layout: ``align``'s launch without one), the tiles."""
    fmt, (scale_bn, scale_bk) = (
        ("none", (1, 1)) if quant is None else (quant.fmt, quant.scale_block)
    )
    n, hidden, inter = sizes.tokens, sizes.hidden, sizes.inter
    apart = pairs_apart(n, fmt, hidden, inter)  # (module docstring, PAIRS APART: no layout read)
    if layout is None and not apart:
        layout = align(ids, sizes.num_routed, sizes.num_shared)
    # a program row a block of the layout (BLOCK_M rows an intermediate block), or a pair
    blocks, block_m = (sizes.pairs, 1) if apart else (layout.blocks, layout.block_m)
    sorted_pairs, block_expert = (ids, ids) if apart else (layout.sorted_pairs, layout.block_expert)
    fp32 = x.dtype == torch.float32
    up_one_row = apart or one_token_rows(n, fmt, hidden)
    down_one_row = apart or one_token_rows(n, fmt, inter)
    up_tiles, down_tiles = tiles or _choose_tiles(n, fmt, fp32, up_one_row, down_one_row)
    return _ExpertPlan(
        sizes=sizes,
        fmt=fmt,
        scale_bn=scale_bn,
        scale_bk=scale_bk,
        apart=apart,
        blocks=blocks,
        block_m=block_m,
        sorted_pairs=sorted_pairs,
        block_expert=block_expert,
        gate_up=_kernel_tiles(up_tiles, up_one_row, hidden, block_m, fmt, scale_bk, quant),
        down=_kernel_tiles(down_tiles, down_one_row, inter, block_m, fmt, scale_bk, quant),
        precision="ieee" if fp32 else "tf32",
        pdl=(quant is None or moe_kernels.quantized_pdl.get(quant.fmt, False))
        and pdl_available(x.device),
    )


def _rows_of_one_stride(
    x: torch.Tensor, shared_input: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, the shared slots' rows: shared_input's, else x's), contiguous along hidden, of one row stride."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    if shared_input is not None and shared_input.stride() != x.stride():
        x, shared_input = x.contiguous(), shared_input.contiguous()
    return x, x if shared_input is None else shared_input


@dataclass(frozen=True)
class _ScalePointers:
    """The quantized stacks' scales as the expert kernels take them, routed and shared: pointers, strides."""

    gate: torch.Tensor  # [routed, ., .] (up's when ungated)
    up: torch.Tensor  # [routed, ., .]
    down: torch.Tensor  # [routed, ., .]
    shared_gate: torch.Tensor  # [shared, ., .] (the routed ones' without shared experts)
    shared_up: torch.Tensor  # [shared, ., .]
    shared_down: torch.Tensor  # [shared, ., .]
    gate_strides: tuple[int, ...]  # (expert, row, column)
    up_strides: tuple[int, ...]
    down_strides: tuple[int, ...]
    # (expert, row): the column stride the routed ones' (moe_quant_kernels.py checks it)
    shared_gate_strides: tuple[int, ...]
    shared_up_strides: tuple[int, ...]
    shared_down_strides: tuple[int, ...]


def _scale_pointers(
    quant: ExpertScales | None,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    shared_gate: torch.Tensor,
    shared_up: torch.Tensor,
    shared_down: torch.Tensor,
) -> _ScalePointers:
    """``quant``'s scales as the kernels take them; without it the weight stacks given here stand in."""
    if quant is None:  # (the weights' pointers and zero strides: not read)
        routed, shared = (gate, up, down), (shared_gate, shared_up, shared_down)
        routed_strides, shared_strides = ((0, 0, 0),) * 3, ((0, 0),) * 3
    else:
        routed, shared = quant.stacks(), quant.shared_stacks()
        routed_strides = tuple(t.stride() for t in routed)
        shared_strides = tuple(t.stride()[:2] for t in shared)
    return _ScalePointers(*routed, *shared, *routed_strides, *shared_strides)


def _launch_gate_up(
    plan: _ExpertPlan,
    x: torch.Tensor,
    shared_x: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    shared_gate: torch.Tensor,
    shared_up: torch.Tensor,
    scales: _ScalePointers,
    ids: torch.Tensor,
    activation: str,
    limit: float | None,
    gated: bool,
    row_scale: torch.Tensor | None,
) -> torch.Tensor:
    """``expert_gate_up_kernel``'s launch (``gate``: up's when ungated, not read) -> the intermediate rows."""
    sizes, tiles = plan.sizes, plan.gate_up
    # [blocks * block_m, inter], written for the real rows
    act = torch.empty(plan.blocks * plan.block_m, sizes.inter, dtype=x.dtype, device=x.device)
    expert_gate_up_kernel[(plan.blocks, triton.cdiv(sizes.inter, tiles.block_n))](
        x,
        shared_x,
        gate,
        up,
        shared_gate,
        shared_up,
        act,
        act if row_scale is None else row_scale,
        scales.gate,
        scales.up,
        scales.shared_gate,
        scales.shared_up,
        plan.sorted_pairs,
        plan.block_expert,
        ids,
        ids.stride(0),
        sizes.pairs,
        sizes.num_routed,
        sizes.inter,
        sizes.hidden,
        float(limit or 0.0),
        x.stride(0),
        gate.stride(0),
        gate.stride(1),
        up.stride(0),
        up.stride(1),
        shared_gate.stride(0),
        shared_gate.stride(1),
        shared_up.stride(0),
        shared_up.stride(1),
        act.stride(0),
        *scales.gate_strides,
        *scales.up_strides,
        *scales.shared_gate_strides,
        *scales.shared_up_strides,
        TOP_K=sizes.top_k,
        SLOTS=sizes.slots,
        BLOCK_M=plan.block_m,
        ROWS=tiles.rows,
        PAIRS_APART=plan.apart,
        GROUP=tiles.group,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        K_TILED=tiles.k_tiled,
        PRECISION=plan.precision,
        ACT=activation,
        GATED=gated,
        CLAMP=limit is not None,
        FORMAT=plan.fmt,
        SCALE_BN=plan.scale_bn,
        SCALE_BK=plan.scale_bk,
        ROW_SCALE=row_scale is not None,
        PDL=plan.pdl,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
        **pdl_launch_options(plan.pdl),
    )
    return act


def _launch_down(
    plan: _ExpertPlan,
    act: torch.Tensor,
    down: torch.Tensor,
    shared_down: torch.Tensor,
    weights: torch.Tensor,
    scales: _ScalePointers,
    ids: torch.Tensor,
) -> torch.Tensor:
    """``expert_down_kernel``'s launch -> each pair's row times its routing weight (a skipped slot's unwritten)."""
    sizes, tiles = plan.sizes, plan.down
    # [pairs, hidden]; the skipped slots' rows stay unwritten: the combine kernel adds zeros for them
    partial = torch.empty(sizes.pairs, sizes.hidden, dtype=torch.float32, device=act.device)
    expert_down_kernel[(plan.blocks, triton.cdiv(sizes.hidden, tiles.block_n))](
        act,
        down,
        shared_down,
        weights,
        partial,
        scales.down,
        scales.shared_down,
        plan.sorted_pairs,
        plan.block_expert,
        ids,
        ids.stride(0),
        sizes.pairs,
        sizes.num_routed,
        sizes.inter,
        sizes.hidden,
        act.stride(0),
        down.stride(0),
        down.stride(1),
        shared_down.stride(0),
        shared_down.stride(1),
        weights.stride(0),
        partial.stride(0),
        *scales.down_strides,
        *scales.shared_down_strides,
        WEIGHTED_SLOTS=weights.shape[1],
        TOP_K=sizes.top_k,
        SLOTS=sizes.slots,
        BLOCK_M=plan.block_m,
        ROWS=tiles.rows,
        PAIRS_APART=plan.apart,
        GROUP=tiles.group,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        K_TILED=tiles.k_tiled,
        PRECISION=plan.precision,
        FORMAT=plan.fmt,
        SCALE_BN=plan.scale_bn,
        SCALE_BK=plan.scale_bk,
        PDL=plan.pdl,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
        **pdl_launch_options(plan.pdl),
    )
    return partial


def _launch_combine(
    plan: _ExpertPlan,
    partial: torch.Tensor,
    ids: torch.Tensor,
    x: torch.Tensor,
    shared_apart: bool,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None,
    skipped_slots: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | NormedRows:
    """``expert_combine_kernel``'s launch (each token's slots summed) -> ``grouped_experts``' output."""
    sizes, n, hidden = plan.sizes, plan.sizes.tokens, plan.sizes.hidden
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)  # [n, hidden]
    shared_out = torch.empty_like(out) if shared_apart else out  # the shared slots' sum
    block_h = _combine_block(n, hidden, x.device)
    programs = triton.cdiv(hidden, block_h)
    if ready is not None:
        stream, norm_weight, norm_offset, addend = (*ready, None)[:4]
        stream = stream.contiguous()
        addend = out if addend is None else addend.contiguous()  # (unread without one)
        normed = torch.empty_like(out)
        sq = torch.empty(programs, n, dtype=torch.float32, device=x.device)  # [programs, n]
    else:
        # (unread)
        stream, norm_weight, norm_offset, addend, normed, sq = out, out, 0.0, out, out, out
    expert_combine_kernel[(n, programs)](
        partial,
        out,
        shared_out,
        ids,
        stream,
        addend,
        norm_weight,
        normed,
        sq,
        n,
        hidden,
        norm_offset,
        partial.stride(0),
        out.stride(0),
        ids.stride(0),
        SLOTS=sizes.slots,
        TOP_K=sizes.top_k,
        SKIPS=skipped_slots,
        APART=shared_apart,
        READY=ready is not None,
        ADDEND=addend is not out,
        BLOCK_H=block_h,
        PDL=plan.pdl,
        **pdl_launch_options(plan.pdl),
    )
    if ready is not None:
        return NormedRows(out, normed, sq)
    return (out, shared_out) if shared_apart else out


def grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate: torch.Tensor | None,
    up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
    limit: float | None = None,
    tiles: tuple[Tiles, Tiles] | None = None,
    shared: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None,
    layout: BlockLayout | None = None,
    skipped_slots: bool = False,
    quant: ExpertScales | None = None,
    shared_input: torch.Tensor | None = None,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | NormedRows:
    """x [n, hidden]; weights [n, top_k] float32, or [n, top_k + shared] with the shared slots' weights too
    (module docstring); ids [n, top_k] int (each with its last dimension contiguous); gate (None: ungated
    experts) and up [experts, inter, hidden]; down [experts, hidden, inter] (x's dtype, each with its last
    dimension contiguous); ``activation`` one of ``ACTIVATIONS``, ``limit`` the optional clamp; ``shared``
    the shared experts' (gate, up, down) stacks of the same layout, dtype and inter, fused (module
    docstring); ``layout`` the block layout of ids and the shared slots when the routing kernel wrote it
    (else ``_align_kernel`` writes it) -> sum over slots j of weights[:, j] times expert ids[:, j] applied
    to x, plus the shared experts' output: [n, hidden] in x's dtype, accumulated in float32 (the
    intermediate rounded to x's dtype, as the eager experts round it). No host synchronisation.
    ``skipped_slots``: ids may be -1 (another expert-parallel rank's expert), a slot that adds nothing (its
    partial row is neither computed nor read; with ``layout``, ids are the ids it was made of: its ``ids``
    where it has them). ``quant``: the stacks are quantized, these are their scales
    (layers/quant/moe_quant_kernels.py, the one caller that passes them), any strides: the routed
    experts' by expert index, quantized shared experts' (``quant.shared``, views of their MLP's own scales
    as ``shared`` is of its weights, of the routed scales' column stride) by shared index, each slot's
    chosen as its weight rows are. ``tiles``: the (gate/up, down) kernels' tiles in place of ``expert_tiles``'
    (benchmarks and tests). ``shared_input`` [n, hidden]: the shared slots read its rows, not x's, and their
    output comes apart: (the routed output, the shared experts' output), each [n, hidden] (module docstring,
    a dense MLP beside the experts). ``ready`` = (stream [n, hidden], weight [hidden], offset[, addend [n,
    hidden] or None]): the output (plus the addend, layers/moe.py ``ReadyStream``) added to the stream in the
    combine's launch and made ready for the RMSNorm of scale offset + weight after the block (``NormedRows``:
    the next layer's input projection folds that norm in). ``row_scale`` [n] float32: x is a stream times its
    norm's weight and each token's gate/up products are scaled by its entry, the norm's factor (layers/moe.py
    ``RowNorm``)."""
    sizes = _expert_sizes(x, ids, down, shared, quant)
    _refuse_bad_expert_inputs(
        sizes, x, weights, ids, gate, up, down, activation, limit, shared, quant, shared_input, ready,
        row_scale,
    )  # fmt: skip
    # (after every refusal: ``align``'s launch)
    plan = _plan_experts(sizes, x, ids, layout, quant, tiles)
    x, shared_x = _rows_of_one_stride(x, shared_input)
    shared_gate, shared_up, shared_down = shared or (gate, up, down)
    # (the gate pointers are not read when ungated)
    gate_w, shared_gate_w = (up, shared_up) if gate is None else (gate, shared_gate)
    scales = _scale_pointers(quant, gate_w, up, down, shared_gate_w, shared_up, shared_down)
    act = _launch_gate_up(
        plan, x, shared_x, gate_w, up, shared_gate_w, shared_up, scales, ids, activation, limit,
        gate is not None, row_scale,
    )  # fmt: skip
    partial = _launch_down(plan, act, down, shared_down, weights, scales, ids)
    return _launch_combine(plan, partial, ids, x, shared_input is not None, ready, skipped_slots)
