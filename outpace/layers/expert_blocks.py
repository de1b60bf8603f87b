"""Routed experts' (token, slot) pairs laid out for the grouped-expert kernels (layers/moe_kernels.py).

The block layout (``BlockLayout``), written by ``_align_kernel`` (one program) or, up to 128 tokens, by
the routing kernel itself (layers/moe_routing_kernel.py: routing and the layout in one launch, placed
from each expert's token mask, ``place_pairs_by_token_masks``): the pairs sorted by expert
into blocks of BLOCK_M rows, each expert's pairs padded to a whole number of blocks, so that a block
holds one expert's pairs only. The number of blocks depends on the routing, but never exceeds
max_blocks = (pairs + min(experts, pairs) * (BLOCK_M - 1)) // BLOCK_M (each expert in use adds at most
one partly filled block; vLLM's moe_align_block_size bounds its padded length the same way), so the
grid is sized for that and the blocks past the routing's last are marked expert -1.
BLOCK_M (``block_rows``) is 16 up to 64 tokens, 64 beyond (prefill). A routed expert rarely gets more
than 16 of a decode or verify step's pairs (DeepSeek-V2-Lite at 32 tokens: 3 on average), so its
weights are read once; a fused shared expert, which every token chooses, is read once per 16 tokens.
Blocks as tall as the token count (one block per expert always) were measured slower on an H200:
DeepSeek-V2-Lite's batch-32 decode at 51.8% of the floor against 71.4% with 16-row blocks
(benchmarks/results/families/), the taller tiles wasting their rows on a few pairs each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from outpace.attention.context import batch_invariant

SMALL_BLOCK_M = 16  # the fewest rows per block: tl.dot's minimum
# beyond ``small_blocks_max_tokens`` (prefill): fewer re-reads of an expert's weights
_LARGE_BLOCK_M = 64
# up to this many tokens the layout's blocks are SMALL_BLOCK_M rows (``block_rows``); not measured past 64 (a batch
# of 32 verifying 3 or 4 tokens: decode_settings.py small_blocks_*)
small_blocks_max_tokens = 64
SORT_CHUNK = 64  # pairs per step of ``sort_pairs_into_blocks``: [64, 64] comparisons


def block_rows(tokens: int) -> int:
    """BLOCK_M for a call over ``tokens`` tokens (module docstring). In batch-invariant mode the small blocks
    whatever the count: the block's size picks the tiles (layers/moe_kernels.py ``expert_tiles``), and so the order in which a row's sums
    over K run, so a token gets the same bits in a decode step and among a prefill's or a wide verify's."""
    if batch_invariant():
        return SMALL_BLOCK_M
    return SMALL_BLOCK_M if tokens <= small_blocks_max_tokens else _LARGE_BLOCK_M


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the blocks the layout fills (module docstring), whatever the routing."""
    return (pairs + min(num_experts, pairs) * (block_m - 1)) // block_m


@dataclass(frozen=True)
class BlockLayout:
    """The (token, slot) pairs sorted by expert into blocks (module docstring)."""

    sorted_pairs: (
        torch.Tensor
    )  # [blocks * block_m] int32: the pair of each row, ``pairs`` if padding
    block_expert: torch.Tensor  # [blocks] int32: each block's expert, -1 past the last
    block_m: int
    cursor: torch.Tensor  # [routed + shared experts] int32: the sort's scratch (counts, next rows)
    # [tokens, top_k]: the routed ids the layout was made of, where they are not the ids the router returns
    # (an expert-parallel rank's own experts' indices, -1 for another rank's: layers/moe_routing_kernel.py)
    ids: torch.Tensor | None = None
    # ids holds -1 for slots in no block (another rank's expert, a row that routes nowhere:
    # layers/routed_rows.py), which the grouped kernels skip (``grouped_experts``' skipped_slots)
    skips: bool = False

    @classmethod
    def empty(cls, tokens: int, slots: int, num_experts: int, device) -> BlockLayout:
        """Unwritten buffers for ``tokens`` x ``slots`` pairs over ``num_experts`` (routed + shared)."""
        block_m = block_rows(tokens)
        blocks = max_blocks(tokens * slots, num_experts, block_m)
        return cls(
            torch.empty(blocks * block_m, dtype=torch.int32, device=device),
            torch.empty(blocks, dtype=torch.int32, device=device),
            block_m,
            torch.empty(num_experts, dtype=torch.int32, device=device),
        )

    @property
    def blocks(self) -> int:
        return self.block_expert.shape[0]


@triton.jit
def _pair_experts(
    ids_ptr, stride_ids, p, pairs, TOP_K: tl.constexpr, SLOTS: tl.constexpr, NUM_ROUTED
):
    """p [CHUNK] pair indices -> their experts [CHUNK] int32: ids[token, slot] for a routed slot,
    NUM_ROUTED + slot - TOP_K for a shared one, -1 past the last pair. (volatile: ids written by other
    programs of the routing kernel, layers/moe_routing_kernel.py, are read past L1, which is not coherent
    across SMs.)"""
    token = p // SLOTS
    slot = p % SLOTS
    routed = tl.load(
        ids_ptr + token * stride_ids + slot,
        mask=(p < pairs) & (slot < TOP_K),
        other=0,
        volatile=True,
    ).to(tl.int32)
    expert = tl.where(slot < TOP_K, routed, NUM_ROUTED + slot - TOP_K)
    return tl.where(p < pairs, expert, -1)


@triton.jit
def _write_blocks(
    counts,  # [BLOCK_E] int32: each expert's pairs
    experts,  # [BLOCK_E]
    e_ok,  # [BLOCK_E]: the routed and shared experts
    sorted_pairs_ptr,
    block_expert_ptr,
    cursor_ptr,
    pairs,
    max_blocks,
    SLOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """The part of the block layout that the counts decide: every row the padding ``pairs`` and every
    block -1, then each expert's blocks from its first (exclusive sum of the blocks before it), and in
    ``cursor_ptr`` each expert's first row, both before a barrier (the caller's pair rows overwrite padding
    and read the cursor after it)."""
    blocks = (counts + BLOCK_M - 1) // BLOCK_M  # [BLOCK_E]
    first_block = tl.cumsum(blocks, axis=0) - blocks  # [BLOCK_E] exclusive
    rows = tl.arange(0, 1024)  # every row: padding first, 1024 rows a step; every block: -1 first
    for start in range(0, max_blocks * BLOCK_M, 1024):
        tl.store(
            sorted_pairs_ptr + start + rows,
            tl.full([1024], 0, tl.int32) + pairs,
            mask=start + rows < max_blocks * BLOCK_M,
        )
    for start in range(0, max_blocks, 1024):
        tl.store(
            block_expert_ptr + start + rows,
            tl.full([1024], -1, tl.int32),
            mask=start + rows < max_blocks,
        )
    tl.store(cursor_ptr + experts, first_block * BLOCK_M, mask=e_ok)
    tl.debug_barrier()  # the padding is written before the blocks and pairs overwrite theirs
    for i in range(0, tl.cdiv(pairs // SLOTS, BLOCK_M)):  # (an expert has at most one pair a token)
        tl.store(block_expert_ptr + first_block + i, experts, mask=e_ok & (i < blocks))


@triton.jit
def _popcount(x):
    """x int64 -> its set bits (int64), in shifts and masks (the interpreter runs it too)."""
    x = x - ((x >> 1) & 0x5555555555555555)  # (bit 63's sign copies are masked off at each step)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (x * 0x0101010101010101) >> 56  # (wraps: the count is the top byte, at most 64)


@triton.jit
def place_pairs_by_token_masks(
    ids_ptr,  # [tokens, TOP_K] int: the routed experts of each token
    token_masks_ptr,  # [MASK_WORDS, routed + shared experts] int64, zeroed: bit t % 64 of word t // 64 set
    # where token t chose the expert
    sorted_pairs_ptr,  # [max_blocks * BLOCK_M] int32, written
    block_expert_ptr,  # [max_blocks] int32, written
    cursor_ptr,  # [routed + shared experts] int32 scratch: each expert's first row
    tokens,  # at most 64 * MASK_WORDS
    max_blocks,
    NUM_ROUTED,
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_E: tl.constexpr,  # a power of two >= routed + shared experts
    BLOCK_M: tl.constexpr,
    PAIR_BLOCK: tl.constexpr,  # the pairs placed a step, a power of two
    MASK_WORDS: tl.constexpr,  # 1 or 2
):
    """The block layout of ``sort_pairs_into_blocks``, bit for bit, by the one program that calls it, for
    up to 128 tokens whose routing marked each chosen expert's token mask (layers/moe_routing_kernel.py: the
    programs that route the tokens in parallel set the bits; the last of them calls this). An expert is
    chosen at most once a token, so the pairs of expert e before pair (t, slot) are those of the earlier
    tokens that chose e: its row is e's first row plus the set bits of mask[e] below token t's, and e's pair
    count all of mask[e]'s. Every pair at once (PAIR_BLOCK a step): a few dependent reads in all, where the
    sort's chunks each wait for the cursor the chunk before wrote. Leaves every mask at zero (the next
    launch's starting point)."""
    experts = tl.arange(0, BLOCK_E)
    num_experts = NUM_ROUTED + SLOTS - TOP_K  # a mask word's length
    e_ok = experts < num_experts
    # (volatile: set by atomics of other programs, in L2)
    counts = _popcount(tl.load(token_masks_ptr + experts, mask=e_ok, other=0, volatile=True))
    if MASK_WORDS == 2:  # tokens 64 .. 127
        high = tl.load(token_masks_ptr + num_experts + experts, mask=e_ok, other=0, volatile=True)
        counts += _popcount(high)  # [BLOCK_E]
    pairs = tokens * SLOTS
    _write_blocks(
        counts.to(tl.int32),
        experts,
        e_ok,
        sorted_pairs_ptr,
        block_expert_ptr,
        cursor_ptr,
        pairs,
        max_blocks,
        SLOTS,
        BLOCK_M,
    )
    for start in range(0, pairs, PAIR_BLOCK):
        p = start + tl.arange(0, PAIR_BLOCK)  # [PAIR_BLOCK] pairs
        expert = _pair_experts(ids_ptr, TOP_K, p, pairs, TOP_K, SLOTS, NUM_ROUTED)  # [PAIR_BLOCK]
        placed = expert >= 0
        # (past the last pair: a shift still in range)
        token = tl.minimum(p // SLOTS, 64 * MASK_WORDS - 1).to(tl.int64)
        one = tl.full([PAIR_BLOCK], 1, tl.int64)
        # word 0's bits of the earlier tokens: 0 .. t - 1, or all 64 from token 64
        earlier = tl.where(token < 64, (one << tl.minimum(token, 63)) - 1, -1)
        chose = tl.load(token_masks_ptr + expert, mask=placed, other=0, volatile=True)
        before = _popcount(chose & earlier)  # [PAIR_BLOCK]
        if MASK_WORDS == 2:  # and word 1's: tokens 64 .. t - 1 (none below token 64)
            earlier = (one << tl.maximum(token - 64, 0)) - 1
            chose = tl.load(
                token_masks_ptr + num_experts + expert, mask=placed, other=0, volatile=True
            )
            before += _popcount(chose & earlier)
        first_row = tl.load(cursor_ptr + expert, mask=placed, other=0, volatile=True)
        tl.store(sorted_pairs_ptr + first_row + before.to(tl.int32), p, mask=placed)
    tl.debug_barrier()  # every mask read before any is zeroed
    for word in tl.static_range(MASK_WORDS):
        tl.store(
            token_masks_ptr + word * num_experts + experts,
            tl.zeros([BLOCK_E], tl.int64),
            mask=e_ok,
        )


@triton.jit
def _picked(hit, values, other):
    """hit [rows, n] (at most one True a row), values [n] -> [rows]: each row's hit value, ``other`` where none."""
    found = tl.max(hit.to(tl.int32), axis=1) > 0
    return tl.where(found, tl.sum(tl.where(hit, values[None, :], 0), axis=1), other)


@triton.jit
def place_one_token(
    routed,  # [1, BLOCK_K] int: the token's routed experts by slot (those past TOP_K unread), -1 in no block
    sorted_pairs_ptr,  # [max_blocks * BLOCK_M] int32, written
    block_expert_ptr,  # [max_blocks] int32, written
    max_blocks,
    NUM_ROUTED,  # the layout's routed experts: shared slot j is expert NUM_ROUTED + j
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a power of two >= TOP_K
    BLOCK_S: tl.constexpr,  # a power of two >= SLOTS
    BLOCK_M: tl.constexpr,
):
    """The block layout of ``sort_pairs_into_blocks`` for a single token, bit for bit, from its experts in
    registers (layers/moe_routing_kernel.py's decode of one token). A token chooses an expert at most once, so
    each chosen expert is one block holding one pair: block j is the expert with j chosen ones below it, its
    first row that slot's pair (the slot: token 0), every other row the padding ``SLOTS`` and every block past
    the chosen ones -1. One pass of stores, no atomic and no read of another thread's writes."""
    ROWS: tl.constexpr = 128  # rows (and blocks) a store step
    slot = tl.arange(0, BLOCK_S)  # [BLOCK_S]
    k = tl.arange(0, BLOCK_K)
    chosen = tl.sum(tl.where(k[None, :] == slot[:, None], routed, 0), axis=1)  # [BLOCK_S]
    expert = tl.where(slot < TOP_K, chosen, NUM_ROUTED + slot - TOP_K).to(tl.int32)
    placed = (slot < SLOTS) & (expert >= 0)
    below = placed[None, :] & (expert[None, :] < expert[:, None])  # [BLOCK_S, BLOCK_S]
    block = tl.where(placed, tl.sum(below.to(tl.int32), axis=1), -1)  # [BLOCK_S] each slot's block
    steps = tl.arange(0, ROWS)
    for start in range(0, max_blocks * BLOCK_M, ROWS):
        rows = start + steps  # [ROWS]
        hit = ((rows % BLOCK_M) == 0)[:, None] & (block[None, :] == (rows // BLOCK_M)[:, None])
        pair = _picked(hit, slot, SLOTS)
        tl.store(sorted_pairs_ptr + rows, pair, mask=rows < max_blocks * BLOCK_M)
    for start in range(0, max_blocks, ROWS):
        blocks = start + steps  # [ROWS]
        hit = block[None, :] == blocks[:, None]  # [ROWS, BLOCK_S]
        owner = _picked(hit, expert, -1)
        tl.store(block_expert_ptr + blocks, owner, mask=blocks < max_blocks)


@triton.jit
def sort_pairs_into_blocks(
    ids_ptr,  # [tokens, >= TOP_K] int: the routed experts of each token (row stride stride_ids)
    stride_ids,
    sorted_pairs_ptr,  # [max_blocks * BLOCK_M] int32, written: pair per row, pairs if padding
    block_expert_ptr,  # [max_blocks] int32, written: each block's expert, -1 past the last
    cursor_ptr,  # [routed + shared experts] int32 scratch: counts, then each expert's next row
    pairs,  # tokens * SLOTS
    max_blocks,
    NUM_ROUTED,
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_E: tl.constexpr,  # a power of two >= routed + shared experts
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """The block layout (module docstring), by the one program that calls it. Pairs keep their order
    within an expert (stable), rows past an expert's pairs hold the sentinel ``pairs``. A routed id of -1
    (another expert-parallel rank's expert, layers/moe.py ``ExpertPlacement``) puts its pair in no block.

    Its cost grows with the pairs, not with pairs x experts: the counts are integer atomic increments
    (the same sums in any order), each expert's blocks are written from its first block, and a pair's
    row is its expert's cursor (gathered from ``cursor_ptr``) plus the earlier pairs of that expert in its
    chunk of CHUNK ([CHUNK, CHUNK] comparisons). One-hot [CHUNK, experts] tiles, as this sort was first
    written, cost Qwen3-Next (512 routed experts and its shared one: 1024-wide tiles) 144 us a layer at
    batch 32 on an H200 (benchmarks/results/gpu_2026-11-29d)."""
    experts = tl.arange(0, BLOCK_E)
    offs = tl.arange(0, CHUNK)
    e_ok = experts < NUM_ROUTED + SLOTS - TOP_K
    tl.store(cursor_ptr + experts, tl.zeros([BLOCK_E], tl.int32), mask=e_ok)
    tl.debug_barrier()
    for start in range(0, pairs, CHUNK):
        ids = _pair_experts(ids_ptr, stride_ids, start + offs, pairs, TOP_K, SLOTS, NUM_ROUTED)
        tl.atomic_add(cursor_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=ids >= 0)
    tl.debug_barrier()
    # (volatile: the atomics were made in L2, so these reads bypass L1, as the cursor reads below)
    counts = tl.load(cursor_ptr + experts, mask=e_ok, other=0, volatile=True)  # [BLOCK_E]
    _write_blocks(
        counts,
        experts,
        e_ok,
        sorted_pairs_ptr,
        block_expert_ptr,
        cursor_ptr,
        pairs,
        max_blocks,
        SLOTS,
        BLOCK_M,
    )
    earlier = offs[None, :] < offs[:, None]  # [CHUNK, CHUNK]: column pair before row pair
    for start in range(0, pairs, CHUNK):
        ids = _pair_experts(ids_ptr, stride_ids, start + offs, pairs, TOP_K, SLOTS, NUM_ROUTED)
        placed = ids >= 0
        same = ids[:, None] == ids[None, :]  # [CHUNK, CHUNK]
        before = tl.sum((same & earlier).to(tl.int32), axis=1)  # [CHUNK]
        in_chunk = tl.sum(same.to(tl.int32), axis=1)  # [CHUNK] the chunk's pairs of the expert
        base = tl.load(cursor_ptr + ids, mask=placed, other=0, volatile=True)  # [CHUNK]
        tl.store(sorted_pairs_ptr + base + before, start + offs, mask=placed)
        tl.debug_barrier()  # every cursor read before any moves on
        tl.store(cursor_ptr + ids, base + in_chunk, mask=placed)  # (an expert's pairs agree)
        tl.debug_barrier()


@triton.jit(do_not_specialize=["pairs", "max_blocks"])  # (counts of the call: engine/warm_up.py)
def _align_kernel(
    ids_ptr,
    stride_ids,
    sorted_pairs_ptr,
    block_expert_ptr,
    cursor_ptr,
    pairs,
    max_blocks,
    NUM_ROUTED,
    TOP_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program: the block layout of routing that did not write it (``sort_pairs_into_blocks``)."""
    sort_pairs_into_blocks(
        ids_ptr,
        stride_ids,
        sorted_pairs_ptr,
        block_expert_ptr,
        cursor_ptr,
        pairs,
        max_blocks,
        NUM_ROUTED,
        TOP_K,
        SLOTS,
        BLOCK_E,
        BLOCK_M,
        CHUNK,
    )


def align(ids: torch.Tensor, num_routed: int, num_shared: int = 0) -> BlockLayout:
    """ids [tokens, top_k] -> the block layout of its pairs and the ``num_shared`` shared slots."""
    tokens, top_k = ids.shape
    experts, slots = num_routed + num_shared, top_k + num_shared
    layout = BlockLayout.empty(tokens, slots, experts, ids.device)
    _align_kernel[(1,)](
        ids,
        ids.stride(0),
        layout.sorted_pairs,
        layout.block_expert,
        layout.cursor,
        tokens * slots,
        layout.blocks,
        num_routed,
        TOP_K=top_k,
        SLOTS=slots,
        BLOCK_E=max(16, triton.next_power_of_2(experts)),
        BLOCK_M=layout.block_m,
        CHUNK=SORT_CHUNK,
        num_warps=8,
    )
    return replace(layout, ids=ids)
