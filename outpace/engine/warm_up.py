"""Prefill steps of requests that exist only at start-up: the KV sizing's profile forward, and the GPU
warm-up that compiles, before the first request, the kernel variants an eager prefill chunk selects by
its shape.

Triton compiles a kernel once per set of constexpr arguments. The decode steps and the lone prefill
chunks that a prefill bucket holds are captured at start-up (engine/prefill_graphs.py), so theirs are
compiled then; other prefill steps (several chunks, longer ones, the context's end, engines without graphs)
run eagerly, and their launches derive compile-time values from the chunk:
the paged attention kernel its tile height from the longest query (16 to 128 rows of query tokens times the
GQA group) and its KV split, with the merge's width, from the grid's size and the block table's capacity
(attention/triton_kernels.launch_config); MoE routing its tiles and logit splits from the token count. On an
H100 each new variant costs the request that meets it one to two seconds of compiling
(benchmarks/scripts/diag_first_use.py: the README's command spent 25 of its 53 s compiling and reported 27
tokens/s; a short uncached suffix after a long cached prefix met new variants on every length class).

A length class is what Triton compiles a kernel for: the values a launch derives from its token count, a
function of the count's power of two, and the count itself where an integer argument is specialised (1, a
multiple of 16, or neither; the kernels mark their token counts ``do_not_specialize``, which not every
argument derived from them is). A drafter meets each chunk in fewer rows than the target (an MTP layer's
run is its chunk less the rows it keeps for the next one: speculative/drafters/mtp.py). So the warm-up runs
(``warm_query_lengths``) every length up to 8 (each small power of two for an offset of up to 3 rows) and,
from 16 to ``LONGEST_WARM_QUERY`` (every tile height, whatever the group), each power of two and one less;
each alone after no prefix and after cached prefixes of every power of two from ``SHORTEST_WARM_PREFIX`` to
``LONGEST_WARM_PREFIX`` rows (every split width; whole blocks, as a prefix-cache hit is), sampled (few
programs: split KV), and as a full batch without a prefix (many programs: unsplit; greedy). Longer chunks, up
to ``LONGEST_WARM_CHUNK`` and the step's budget, run the same pair of lengths alone after no prefix and after
one block: past the tiles only grids change. Powers of two alone let DeepSeek's MTP engine on the H200
compile MoE routing, MLA merge and projection variants (0.5 to 4.5 s each) inside timed requests, whose
prefix-cache suffixes fell between powers (benchmarks/results/gpu_2026-12-01h, calls 1 and 3). Last, batches
of one-token chunks (each power of two up to ``max_seqs``) after each power-of-two prefix up to
``LONGEST_ONE_TOKEN_PREFIX``: a step whose every request is a prefix-cache hit but its last token has tiles of one
token's heads and KV splits that follow its prefix, an MLA merge variant that no lone chunk and no prefix-free
batch meets (``tests/engine/test_warm_up.py`` counts them from the launch rules; not yet observed on a GPU).

Drafters absorb each chunk as they would a prompt's; the prefixes are taken as prefix-cache hits (their
rows' contents do not matter: the outputs are dropped). On an engine with prefill graphs the lone chunks
replay those graphs like any lone chunk, so they compile no eager variant: a lone chunk that runs eagerly
there (at the context's end) still compiles its variant when first met. With Triton's disk cache, later
processes load the variants instead of compiling them.
"""

from __future__ import annotations

from collections.abc import Sequence

from tqdm.auto import tqdm

from outpace.cache.block_pool import BlockPool
from outpace.request import Request
from outpace.sampling_params import SamplingParams

LONGEST_WARM_QUERY = (
    128  # tile rows are at most 128: with one query head per KV head, 128 tokens fill them
)
# A prefix-cache hit's rows, whole blocks: from one block, where a chunk's attention runs in few splits (two:
# the MLA merge's widest token tiles, compiled inside a timed request after a 16-row hit, gpu_2026-12-01h call 4)
SHORTEST_WARM_PREFIX = 16
LONGEST_WARM_PREFIX = 4096  # 64 splits (the most) of 64 rows: longer tables select no new variant
# Chunks past LONGEST_WARM_QUERY, up to the step's token budget, alone after no prefix and after one block: tiles stop
# growing there, but the programs a launch spreads over still follow the chunk's power of two (MoE routing's
# logit splits reach one at 4096 tokens for the fewest experts, the attention's KV splits when its query tiles
# fill the GPU), and with them compile-time values (the routing kernel's SPLITS, the attention merge's width).
LONGEST_WARM_CHUNK = 4096
# Batches of one-token chunks (every request a prefix-cache hit but its last token) after prefixes up to this: the
# attention's KV splits then follow the prefix (a split a KV tile, at most about two programs an SM over the
# batch), and with them the MLA merge's token tiles, up to 16 splits (512 rows); one token a row tile, its own
# tile height.
LONGEST_ONE_TOKEN_PREFIX = 512


def scratch_prefill(
    runner,
    pool: BlockPool,
    lengths: Sequence[int],
    params: SamplingParams | None = None,
    prefix: int = 0,
) -> None:
    """One prefill step through the runner of requests (all-zero tokens) that each bring ``lengths[i]``
    new tokens after ``prefix`` rows taken as a prefix-cache hit, and complete their prompts; their
    blocks and indices are free again afterwards."""
    from outpace.engine.scheduler import (
        ScheduledRequest,  # the scheduler imports the pool: no cycle at load
    )

    params = params or SamplingParams(temperature=0, max_tokens=1)
    reqs = [
        Request(f"scratch-prefill-{i}", [0] * (prefix + n), params) for i, n in enumerate(lengths)
    ]
    try:
        for r in reqs:
            pool.grow(r.request_id, r.num_tokens)
            r.num_computed_tokens = prefix
        runner.execute(
            [ScheduledRequest(r, n, num_reused_tokens=prefix) for r, n in zip(reqs, lengths)]
        )
    finally:
        for r in reqs:
            runner.release(r.request_id)
            pool.free(r.request_id)


def warm_up_prefills(
    runner, pool: BlockPool, max_seqs: int, max_batched_tokens: int, max_len: int
) -> None:
    """Run the module docstring's warm-up chunks (``warm_up_steps``)."""
    steps = warm_up_steps(pool, max_seqs, max_batched_tokens, max_len)
    for lengths, params, prefix in tqdm(
        steps, desc="warming up prefill kernels", disable=len(steps) < 8
    ):
        scratch_prefill(runner, pool, lengths, params, prefix)


def warm_up_steps(
    pool: BlockPool, max_seqs: int, max_batched_tokens: int, max_len: int
) -> list[tuple[list[int], SamplingParams | None, int]]:
    """The module docstring's warm-up chunks whose rows fit ``max_len`` and the pool's free blocks, in batches
    within ``max_seqs`` and ``max_batched_tokens``: (chunk lengths, sampling parameters or None for greedy, the
    rows before each chunk) of each scratch prefill, in order."""
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=1, seed=0)

    def fits(rows: int, seqs: int = 1) -> bool:
        return rows < max_len and seqs * pool.blocks_needed(rows) <= pool.num_free

    steps = []  # (lengths, params, prefix) of each scratch prefill
    for length in warm_query_lengths(LONGEST_WARM_QUERY):
        if not fits(length):
            break
        prefixes = [0] + [
            p
            for p in _powers_of_two(SHORTEST_WARM_PREFIX, LONGEST_WARM_PREFIX)
            if p % pool.block_size == 0 and fits(p + length)
        ]
        steps += [([length], sampled, prefix) for prefix in prefixes]
        batch = min(
            max_seqs, max_batched_tokens // length, pool.num_free // pool.blocks_needed(length)
        )
        if batch > 1:
            steps.append(([length] * batch, None, 0))
    for length in long_chunk_lengths(min(LONGEST_WARM_CHUNK, max_batched_tokens)):
        if not fits(length):
            break
        prefixes = [0, pool.block_size] if fits(pool.block_size + length) else [0]
        steps += [([length], sampled, prefix) for prefix in prefixes]
    for batch in _powers_of_two(2, min(max_seqs, max_batched_tokens)):
        steps += [
            ([1] * batch, None, prefix)
            for prefix in _powers_of_two(SHORTEST_WARM_PREFIX, LONGEST_ONE_TOKEN_PREFIX)
            if prefix % pool.block_size == 0 and fits(prefix + 1, batch)
        ]
    return steps


def warm_query_lengths(longest: int) -> list[int]:
    """Chunk lengths that meet every length class (module docstring) up to ``longest``, ascending: 1 to 8, then
    each power of two p >= 16 and p - 1, which shares p's tiles but is no multiple of 16."""
    return list(range(1, min(8, longest) + 1)) + _powers_and_one_less(16, longest)


def long_chunk_lengths(longest: int) -> list[int]:
    """The chunk lengths past ``LONGEST_WARM_QUERY`` up to ``longest`` (module docstring), ascending: each power of
    two p and p - 1."""
    return _powers_and_one_less(2 * LONGEST_WARM_QUERY, longest)


def _powers_and_one_less(lo: int, hi: int) -> list[int]:
    """p - 1 and p for each power of two p from ``lo`` to ``hi``: one length of each Triton class per tile."""
    return [n for p in _powers_of_two(lo, hi) for n in (p - 1, p)]


def _powers_of_two(lo: int, hi: int) -> list[int]:
    return [1 << i for i in range(lo.bit_length() - 1, hi.bit_length())]
