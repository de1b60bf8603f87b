"""One Triton launch that moves token rows inside every paged cache tensor of a model (the tree commit of
cache/kv_cache.py ``CacheRows``), instead of a gather and a scatter per tensor: 2 launches x 2 tensors x
32 layers took 0.47 ms of an 8B-shaped batch-1 tree step on the H100 (benchmarks/scripts/diag_spec_step.py).

The tensors are reached through a table of their base addresses (the way SGLang's
``copy_all_layer_kv_cache`` kernel reaches every layer's buffer), so one program serves one
(tensor, request) pair and copies that request's rows one after another, in column order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _move_rows_kernel(
    bases,
    row_strides,
    row_bytes,
    src,
    dst,
    WIDTH: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    t = tl.program_id(0)  # the tensor
    r = tl.program_id(1)  # the request
    base = tl.load(bases + t).to(tl.pointer_type(tl.uint8))
    stride = tl.load(row_strides + t)
    nbytes = tl.load(row_bytes + t)
    offs = tl.arange(0, CHUNK)
    for i in tl.static_range(1, WIDTH):  # column 0 (the last committed token) never moves
        s = tl.load(src + r * WIDTH + i)
        d = tl.load(dst + r * WIDTH + i)
        if s != d:
            for c in tl.static_range(NUM_CHUNKS):
                m = c * CHUNK + offs < nbytes
                row = tl.load(base + s * stride + c * CHUNK + offs, mask=m)
                tl.store(base + d * stride + c * CHUNK + offs, row, mask=m)


def move_rows_all(
    bases: torch.Tensor,
    row_strides: torch.Tensor,
    row_bytes: torch.Tensor,
    max_row_bytes: int,
    src: torch.Tensor,
    dst: torch.Tensor,
) -> None:
    """``bases``, ``row_strides``, ``row_bytes``  # [tensors] int64: each tensor's address, bytes from one
    token row to the next, bytes of one row; ``src``, ``dst``  # [b, width] int64 flat token rows."""
    chunk = min(triton.next_power_of_2(max_row_bytes), 4096)
    grid = (bases.numel(), src.shape[0])
    _move_rows_kernel[grid](
        bases,
        row_strides,
        row_bytes,
        src,
        dst,
        WIDTH=src.shape[1],
        CHUNK=chunk,
        NUM_CHUNKS=triton.cdiv(max_row_bytes, chunk),
    )
