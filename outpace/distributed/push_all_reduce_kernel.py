"""The push all-reduce: each rank writes its tensor into every peer's symmetric buffer over NVLink and sums
what its own buffer receives, with no barrier: a slot's value is its own arrival flag.

A buffer slot holds the bits of a message, and a value that no message can hold marks it empty: the
sign-flipped zero (bf16 0x8000, float32 0x80000000). A rank sends its tensor with every -0.0 made +0.0 (a
sum that changes no value), so a received element that is not -0.0 has arrived; the reader spins on its
own buffer's slots with volatile loads until none is empty, sums the ranks in rank order in float32 (every
rank gets the same bits, whatever the message's size), and empties the slots again for a later call. The
idea is Leslie Lamport's (a value written once carries its own validity), as NVIDIA's TensorRT-LLM uses it
in its "lamport" one-shot all-reduce; a barrier-based one-shot kernel (torch's
``symm_mem.one_shot_all_reduce``) pays two round trips over NVLink a call, this one a single one-way write.

Why two buffers (``phase``): a rank that has every peer's data for call k moves on to call k + 1 and writes
into its peers' buffers at once, while a slower peer may still be waiting for call k's other slots. So
consecutive calls use different buffers: call k uses buffer epoch % 2, where epoch counts the calls (a
device counter every rank keeps in step, as every rank makes the same calls; the last program of a call
advances it). Call k + 2 may reuse call k's buffer: a rank writes into it only after finishing call k + 1,
which needed every peer's data for call k + 1, which each peer sent only after its kernel for call k had
ended (kernels of one stream run in order; this kernel is never launched early, so a peer's emptying of
call k's slots is done before its writes for call k + 1 start).

Every program must be resident at once (a program waits for its counterpart on every peer): the grid is at
most 256 small programs (a 512 KB bf16 message in 1024-element blocks; layers/all_reduce_norm.py's, one a
token row, fewer), two an SM. Tested on the CPU under Triton's interpreter with one process playing every rank
(tests/distributed/test_push_all_reduce.py) and on two GPUs (tests/gpu/test_gpu_symmetric_all_reduce.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from outpace.distributed.symmetric_all_reduce import BITS, MAX_BYTES

BLOCK = 1024  # elements a program sends and sums
TRITON_BITS = {torch.int16: tl.int16, torch.int32: tl.int32}


@triton.jit
def _buffer(buffers_ptr, rank, BITS_TY: tl.constexpr):
    """Rank ``rank``'s buffer, from its address (a peer's memory mapped into this process: Triton's launcher
    refuses such tensors as arguments, as it cannot query their device)."""
    return tl.load(buffers_ptr + rank).to(tl.pointer_type(BITS_TY))


@triton.jit
def pushed_sum(
    x_ptr,  # this rank's tensor (bf16 or float32)
    offs,  # [BLOCK] the elements this program sends and sums (of a flat message of at most a slot)
    ok,  # [BLOCK] those that exist
    buffers_ptr,  # [WORLD] int64: rank r's symmetric buffer [2, WORLD, slot] of BITS_TY, by address
    epoch_ptr,  # [1] int32: the calls made so far (module docstring)
    slot,  # elements a slot holds (the buffer's last dimension)
    BITS_TY: tl.constexpr,  # the integer type of x's bits
    EMPTY: tl.constexpr,  # the empty slot's bits: -0.0
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The sum over the ranks of x's elements ``offs``, in rank order in float32 [BLOCK]: this rank's sent into
    every peer's buffer, the peers' waited for in this rank's own and its slots emptied again. The call must
    end with ``end_call`` (every program of it)."""
    phase = tl.load(epoch_ptr) % 2
    bits = tl.load(x_ptr + offs, mask=ok, other=0.0).to(BITS_TY, bitcast=True)
    bits = tl.where(bits == EMPTY, 0, bits)  # -0.0 sent as +0.0
    for peer in tl.static_range(WORLD):
        if peer != RANK:  # into the peer's buffer, at this rank's slot
            tl.store(
                _buffer(buffers_ptr, peer, BITS_TY) + (phase * WORLD + RANK) * slot + offs,
                bits,
                mask=ok,
            )
    total = tl.zeros([BLOCK], tl.float32)
    for source in tl.static_range(WORLD):  # in rank order
        if source == RANK:
            got = bits
        else:  # wait for the source's bits, then empty its slot
            slot_ptr = (
                _buffer(buffers_ptr, RANK, BITS_TY) + (phase * WORLD + source) * slot + offs
            )  # [BLOCK]
            got = tl.load(slot_ptr, mask=ok, other=0, volatile=True)
            while tl.max(tl.where(got == EMPTY, 1, 0)) > 0:
                got = tl.load(slot_ptr, mask=ok, other=0, volatile=True)
            tl.store(slot_ptr, tl.full([BLOCK], EMPTY, got.dtype), mask=ok)
        total += got.to(x_ptr.dtype.element_ty, bitcast=True).to(tl.float32)
    return total


@triton.jit
def end_call(epoch_ptr, arrivals_ptr):
    """A program of the call is done; the last one readies the counters for the next call."""
    if tl.atomic_add(arrivals_ptr, 1) == tl.num_programs(0) - 1:
        tl.store(arrivals_ptr, 0)
        tl.store(epoch_ptr, tl.load(epoch_ptr) + 1)


@triton.jit
def _push_all_reduce_kernel(
    x_ptr,  # [n] this rank's tensor (bf16 or float32)
    out_ptr,  # [n] the sum, written (may be x)
    buffers_ptr,  # [WORLD] int64 (``pushed_sum``)
    epoch_ptr,  # [1] int32: the calls made so far (module docstring)
    arrivals_ptr,  # [1] int32: this call's finished programs, 0 between calls
    n,
    slot,
    BITS_TY: tl.constexpr,
    EMPTY: tl.constexpr,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    ok = offs < n
    total = pushed_sum(
        x_ptr, offs, ok, buffers_ptr, epoch_ptr, slot, BITS_TY, EMPTY, RANK, WORLD, BLOCK
    )
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=ok)
    end_call(epoch_ptr, arrivals_ptr)


def push_arguments(symmetric, dtype: torch.dtype) -> tuple[tuple, dict]:
    """What a kernel built on ``pushed_sum`` takes of ``symmetric`` (distributed/symmetric_all_reduce.py
    ``SymmetricAllReduce``) for a message of ``dtype``: (buffers' addresses, epoch, arrivals, slot) and the
    constants (BITS_TY, EMPTY, RANK, WORLD)."""
    bits, empty = BITS[dtype]
    buffers = symmetric.buffers[dtype]
    slot = MAX_BYTES // dtype.itemsize  # (elements of a rank's slot in each buffer)
    constants = dict(
        BITS_TY=TRITON_BITS[bits], EMPTY=empty, RANK=symmetric.rank, WORLD=buffers.shape[0]
    )
    return (buffers, symmetric.epoch, symmetric.arrivals, slot), constants


def push_all_reduce_(x: torch.Tensor, symmetric) -> torch.Tensor:
    """``x`` (``symmetric.takes(x)``) replaced by its sum over the ranks of ``symmetric`` (its buffers
    emptied, its counters as the last call left them). Returns ``x``."""
    flat = x.view(-1)  # [n]
    (buffers, epoch, arrivals, slot), constants = push_arguments(symmetric, x.dtype)
    _push_all_reduce_kernel[(triton.cdiv(flat.numel(), BLOCK),)](
        flat, flat, buffers, epoch, arrivals, flat.numel(), slot, **constants, BLOCK=BLOCK
    )
    return x
