"""The kernel of layers/l2_prefetch.py: a contiguous span of bytes asked into L2, chunk by chunk, with Hopper's bulk
prefetch (``cp.async.bulk.prefetch.L2.global [address], size``: PTX ISA 8.0, sm_90; the address 16-byte aligned and
the size a multiple of 16, CUDA's cuda::ptx::cp_async_bulk_prefetch). It writes nothing and reads nothing into
registers: the launch ends once its instructions are issued, the bytes arriving in L2 after it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK_BYTES = 16384  # bytes one prefetch instruction asks for (a multiple of 16)
_CHUNKS_A_PROGRAM = 128  # one a thread at 4 warps


@triton.jit
def _prefetch_kernel(ptr, nbytes, CHUNK: tl.constexpr, CHUNKS: tl.constexpr):
    """Program p asks for chunks p * CHUNKS .. p * CHUNKS + CHUNKS - 1 of the nbytes bytes at ptr (16-byte aligned,
    nbytes a multiple of 16), each of CHUNK bytes (the last one shorter)."""
    start = (tl.program_id(0) * CHUNKS + tl.arange(0, CHUNKS)).to(tl.int64) * CHUNK  # [CHUNKS]
    inside = start < nbytes
    size = tl.where(inside, tl.minimum(nbytes - start, CHUNK), 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptr + tl.where(inside, start, 0), size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def prefetch_span(t: torch.Tensor, fraction: float = 1.0) -> None:
    """Ask t's bytes (contiguous, 16-byte aligned; a tail under 16 bytes left out), or their first ``fraction``
    (16 bytes at least), into L2, on the current stream."""
    nbytes = max(16, int(t.numel() * t.element_size() * fraction) // 16 * 16)
    chunks = triton.cdiv(nbytes, CHUNK_BYTES)
    _prefetch_kernel[(triton.cdiv(chunks, _CHUNKS_A_PROGRAM),)](
        t.view(-1).view(torch.uint8), nbytes, CHUNK=CHUNK_BYTES, CHUNKS=_CHUNKS_A_PROGRAM
    )
