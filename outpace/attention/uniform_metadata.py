"""Attention metadata for a batch in which every sequence brings the same number of new tokens,
built on the device from device tensors (no host synchronisation), so that it can run inside a
CUDA-graph capture (engine/decode_step.py, engine/cuda_graphs.py).

A captured speculative iteration builds one such metadata per draft step and per verify: on CUDA
it is one kernel (``uniform_metadata_kernel``, in uniform_metadata_kernel.py) instead of the ~15
small torch operations the same fields take, which in a graph of tiny kernels cost as much as a
layer. Elsewhere (the CPU tests of
the graph code) torch operations compute the same fields.
"""

from __future__ import annotations

import torch

from outpace.attention.metadata import PagedAttentionMetadata


def uniform_paged_metadata(
    block_tables: torch.Tensor,
    starts: torch.Tensor,
    query_len: int,
    block_size: int,
    custom_mask: torch.Tensor | None = None,
) -> PagedAttentionMetadata:
    """Every sequence brings ``query_len`` new tokens at rows starts[s] .. starts[s] + query_len - 1.

    block_tables [num_seqs, max_blocks] int64 and starts [num_seqs] int64 live on the device.
    custom_mask: [num_seqs, query_len, window] as in ``PagedAttentionMetadata``, or None (causal).
    The token table (``PagedAttentionMetadata.token_table``) comes with it: token s * query_len + i
    is sequence s's i-th; and each token's position, its KV row (``token_positions``: the forward's
    positions, which two more launches computed apart).
    """
    build = _fields_kernel if block_tables.is_cuda else _fields_torch
    slots, seq_lens, query_lens, seq_index, query_index, token_table, token_positions = build(
        block_tables, starts, query_len, block_size
    )
    return PagedAttentionMetadata(
        slot_mapping=slots,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_lens=query_lens,
        token_seq_index=seq_index,
        token_query_index=query_index,
        max_query_len=query_len,
        block_size=block_size,
        custom_mask=custom_mask,
        token_positions=token_positions,
        _token_table=token_table,
    )


def _fields_kernel(
    block_tables: torch.Tensor, starts: torch.Tensor, query_len: int, block_size: int
):
    """(slot_mapping, seq_lens, query_lens, token_seq_index, token_query_index, token_table,
    token_positions), one launch."""
    import triton  # (here: Triton is a GPU dependency, absent from CPU-only installs)

    from outpace.attention.uniform_metadata_kernel import uniform_metadata_kernel

    num_seqs, dev = block_tables.shape[0], block_tables.device
    n = num_seqs * query_len
    slots, seq_index, query_index, token_positions = (
        torch.empty(n, dtype=torch.int64, device=dev) for _ in range(4)
    )
    seq_lens, query_lens = (torch.empty(num_seqs, dtype=torch.int64, device=dev) for _ in range(2))
    token_table = torch.empty(num_seqs, query_len, dtype=torch.int32, device=dev)
    uniform_metadata_kernel[(num_seqs,)](
        block_tables,
        starts,
        slots,
        seq_lens,
        query_lens,
        seq_index,
        query_index,
        token_table,
        token_positions,
        query_len,
        block_tables.stride(0),
        starts.stride(0),
        BLOCK_SIZE=block_size,
        BLOCK_Q=triton.next_power_of_2(query_len),
    )
    return slots, seq_lens, query_lens, seq_index, query_index, token_table, token_positions


def _fields_torch(
    block_tables: torch.Tensor, starts: torch.Tensor, query_len: int, block_size: int
):
    """The same fields as ``_fields_kernel``, with torch operations."""
    num_seqs, dev = block_tables.shape[0], block_tables.device
    q_index = torch.arange(query_len, device=dev)  # [q]
    rows = starts[:, None] + q_index  # [num_seqs, q]
    slots = (
        torch.gather(block_tables, 1, rows // block_size) * block_size + rows % block_size
    ).reshape(-1)
    return (
        slots,
        starts + query_len,
        torch.full((num_seqs,), query_len, dtype=torch.int64, device=dev),
        torch.arange(num_seqs, device=dev).repeat_interleave(query_len),
        q_index.repeat(num_seqs),
        torch.arange(num_seqs * query_len, dtype=torch.int32, device=dev).view(num_seqs, query_len),
        rows.reshape(-1),
    )
