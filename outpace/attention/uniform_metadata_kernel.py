"""The Triton kernel behind ``uniform_paged_metadata`` on CUDA (uniform_metadata.py), in a module of its
own so that importing the attention package never needs Triton."""

import triton
import triton.language as tl


@triton.jit
def uniform_metadata_kernel(
    tables_ptr,
    starts_ptr,
    slots_ptr,
    seq_lens_ptr,
    query_lens_ptr,
    seq_index_ptr,
    query_index_ptr,
    token_table_ptr,
    positions_ptr,
    query_len,
    stride_table,
    stride_starts,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    """Program s: sequence s's tokens s * query_len + i, i < query_len, at KV rows starts[s] + i."""
    seq = tl.program_id(0)
    i = tl.arange(0, BLOCK_Q)
    ok = i < query_len
    start = tl.load(starts_ptr + seq * stride_starts)
    rows = start + i  # [BLOCK_Q]
    block = tl.load(tables_ptr + seq * stride_table + rows // BLOCK_SIZE, mask=ok, other=0)
    token = seq * query_len + i
    tl.store(slots_ptr + token, block * BLOCK_SIZE + rows % BLOCK_SIZE, mask=ok)
    tl.store(seq_index_ptr + token, seq + tl.zeros_like(i).to(tl.int64), mask=ok)
    tl.store(query_index_ptr + token, i.to(tl.int64), mask=ok)
    tl.store(token_table_ptr + token, token.to(tl.int32), mask=ok)  # [num_seqs, query_len]
    tl.store(positions_ptr + token, rows.to(tl.int64), mask=ok)
    tl.store(seq_lens_ptr + seq, start + query_len)
    tl.store(query_lens_ptr + seq, query_len + tl.zeros_like(start))
