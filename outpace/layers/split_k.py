"""Split-K's finish in one launch: the programs that share an output tile each write a float32 partial over
their split of K, count their arrival on the tile's counter, and the last to arrive adds the partials in split
order (from zero: 0 + split 0 + split 1 + ..., the same bits whichever program arrives last) and finishes the
tile. The counters live in zeroed scratch (layers/zeroed_scratch.py): zero when a launch starts, and the last
program of each tile zeroes its counter again, so nothing is cleared between launches (capturable in a CUDA
graph). layers/moe_kernels.py's gate/up kernel finishes this way; the pattern is quant_matmul_kernel.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter_ptr, splits):
    """Count this program's arrival on its tile's counter, after its partials are written -> whether it is
    the last of the tile's ``splits``; that one has zeroed the counter for the next launch. The barrier first:
    one thread takes the count for the whole program, and acq_rel at gpu scope then releases every thread's
    partials (cumulative over the barrier) and lets the last program acquire every other program's."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == splits - 1
    if last:  # every split has counted: nothing reads the counter again in this launch
        tl.atomic_xchg(counter_ptr, 0)
    return last


@triton.jit
def sum_splits(ptrs, split_stride, mask, splits):
    """The float32 sum of the ``splits`` partials at ptrs, ptrs + split_stride, ... (any shape of pointers),
    added in split order from zero. Read past L1 (.cg): programs of the same launch wrote them."""
    total = tl.zeros(ptrs.shape, tl.float32)
    for s in range(splits):
        total += tl.load(ptrs + s * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
    return total
