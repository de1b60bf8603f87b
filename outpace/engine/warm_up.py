"""Prefill steps of requests that exist only at start-up: the KV sizing's profile forward, and the GPU
warm-up that compiles, before the first request, the kernel variants an eager prefill chunk selects by
its shape.

Triton compiles a kernel once per set of constexpr arguments. The decode steps are captured at
start-up, so theirs are compiled then; a prefill chunk runs eagerly, and the paged attention kernel
picks its tile height from the chunk's longest query (16 to 128 rows of query tokens times the GQA
group: attention/triton_kernels.launch_config) and whether it splits the KV from the grid's size. On
an H100 each new variant costs the request that meets it one to two seconds of compiling
(benchmarks/diag_first_use.py: the README's command spent 25 of its 53 s compiling, 27 tokens/s). The
warm-up runs one chunk of every power-of-two length up to ``LONGEST_WARM_QUERY`` (which reaches every
tile height whatever the group), alone (few programs: split KV) and as a full batch of such chunks
(many programs: unsplit), greedy and sampled, and drafters absorb each chunk as they would a prompt's.
With Triton's disk cache, later processes load the variants instead of compiling them.
"""
from __future__ import annotations

from collections.abc import Sequence

from outpace.cache.block_pool import BlockPool
from outpace.config import SamplingParams
from outpace.request import Request

LONGEST_WARM_QUERY = 128  # tile rows are at most 128: with one query head per KV head, 128 tokens fill them


def scratch_prefill(runner, pool: BlockPool, lengths: Sequence[int], params: SamplingParams | None = None) -> None:
    """One prefill step through the runner of requests with prompts of these lengths (all zeros),
    each completing its prompt; their blocks and slots are free again afterwards."""
    from outpace.engine.scheduler import ScheduledRequest  # the scheduler imports the pool: no cycle at load

    params = params or SamplingParams(temperature=0, max_tokens=1)
    reqs = [Request(f"scratch-prefill-{i}", [0] * n, params) for i, n in enumerate(lengths)]
    try:
        for r in reqs:
            pool.grow(r.request_id, r.num_tokens)
        runner.execute([ScheduledRequest(r, r.num_tokens) for r in reqs])
    finally:
        for r in reqs:
            runner.release(r.request_id)
            pool.free(r.request_id)


def warm_up_prefills(runner, pool: BlockPool, max_seqs: int, max_batched_tokens: int, max_len: int) -> None:
    """Run the module docstring's warm-up chunks (lengths below ``max_len``, batches within
    ``max_seqs``, ``max_batched_tokens`` and the pool's free blocks)."""
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=1, seed=0)
    length = 1
    while length <= min(LONGEST_WARM_QUERY, max_len - 1):
        fits = pool.num_free // pool.blocks_needed(length)
        if fits < 1:
            break
        scratch_prefill(runner, pool, [length], sampled)
        batch = min(max_seqs, max_batched_tokens // length, fits)
        if batch > 1:
            scratch_prefill(runner, pool, [length] * batch)
        length *= 2
