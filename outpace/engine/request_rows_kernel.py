"""The decode step's gather of its rows from the request table (engine/request_table.py ``RequestTable.rows``)
in one Triton launch: each program copies one row's length, last token, seed and block table. torch took one
launch a tensor (an index_select and three index kernels, about 8 us at the start of every captured step on
the H200: gpu_2026-12-01b, call 3's timeline of Gemma 4)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 256  # table columns a program copies at a time


@triton.jit
def _gather_rows_kernel(
    indices,
    lengths,
    last_tokens,
    seeds,
    tables,
    out_lengths,
    out_last_tokens,
    out_seeds,
    out_tables,
    table_stride,
    width,
    B: tl.constexpr,
):
    r = tl.program_id(0)
    i = tl.load(indices + r)
    tl.store(out_lengths + r, tl.load(lengths + i))
    tl.store(out_last_tokens + r, tl.load(last_tokens + i))
    tl.store(out_seeds + r, tl.load(seeds + i))
    for start in range(0, width, B):
        cols = start + tl.arange(0, B)
        entries = tl.load(tables + i * table_stride + cols, mask=cols < width)
        tl.store(out_tables + r.to(tl.int64) * width + cols, entries, mask=cols < width)


def gather_rows(
    indices: torch.Tensor,
    lengths: torch.Tensor,
    last_tokens: torch.Tensor,
    seeds: torch.Tensor,
    tables: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tables [b, max_blocks], lengths [b], last_tokens [b], seeds [b]) of the rows ``indices`` [b] (int64,
    like the per-row tensors; ``tables`` [table_rows, max_blocks] with unit column stride)."""
    b, width = indices.shape[0], tables.shape[1]
    out_tables = torch.empty(b, width, dtype=tables.dtype, device=tables.device)
    out_lengths, out_last_tokens, out_seeds = (torch.empty_like(indices) for _ in range(3))
    _gather_rows_kernel[(b,)](
        indices,
        lengths,
        last_tokens,
        seeds,
        tables,
        out_lengths,
        out_last_tokens,
        out_seeds,
        out_tables,
        tables.stride(0),
        width,
        B=BLOCK,
    )
    return out_tables, out_lengths, out_last_tokens, out_seeds
