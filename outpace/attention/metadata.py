"""What one forward's attention needs to know, built once per forward and shared by all layers.

Two kinds:
- ``PagedAttentionMetadata``: serving. Each sequence brings ``query_len`` new tokens whose KV is
  written into its paged cache blocks, and they attend to the sequence's cached prefix plus the
  new tokens allowed by a mask: causal by default, or a per-request tree mask for tree verify.
- ``DenseCausalMetadata``: training and references. ``batch`` equal-length sequences, no cache.

All tensor fields are built on the host before the forward; the forward itself performs no host
synchronisation and no shape-dependent Python branching beyond the two ints recorded here, so a
forward can later be captured in a CUDA graph per (num_seqs, max_query_len, max_blocks) bucket.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class DenseCausalMetadata:
    batch_size: int
    seq_len: int


@dataclass
class PagedAttentionMetadata:
    slot_mapping: torch.Tensor       # [num_tokens] int64: flat cache slot (block * block_size + offset)
    block_tables: torch.Tensor       # [num_seqs, max_blocks] int64, padded with block 0
    seq_lens: torch.Tensor           # [num_seqs] int64: KV length after this forward
    query_lens: torch.Tensor         # [num_seqs] int64: new tokens per sequence
    token_seq_index: torch.Tensor    # [num_tokens] int64: sequence of each new token
    token_query_index: torch.Tensor  # [num_tokens] int64: index of each token among its sequence's new tokens
    max_query_len: int
    block_size: int
    # [num_seqs, max_query_len, max_query_len] bool: new token i may attend to new token j.
    # None means causal. Tree verify passes each request's ancestor mask here.
    custom_mask: torch.Tensor | None = None
    _attn_mask: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.block_tables.shape[0]

    def attn_mask(self) -> torch.Tensor:
        """[num_seqs, 1, max_query_len, max_kv_len] bool, True where attention is allowed.

        Computed on first use and reused by every layer of the forward.
        """
        if self._attn_mask is None:
            max_kv = self.block_tables.shape[1] * self.block_size
            device = self.block_tables.device
            kv_index = torch.arange(max_kv, device=device)                       # [max_kv]
            q_index = torch.arange(self.max_query_len, device=device)            # [max_q]
            prefix_len = (self.seq_lens - self.query_lens)[:, None, None]        # [num_seqs, 1, 1]
            rel = kv_index[None, None, :] - prefix_len                           # [num_seqs, 1, max_kv]
            in_prefix = rel < 0
            if self.custom_mask is None:
                in_new = (rel >= 0) & (rel <= q_index[None, :, None])            # [num_seqs, max_q, max_kv]
            else:
                in_range = (rel >= 0) & (rel < self.query_lens[:, None, None])
                idx = rel.clamp(0, self.max_query_len - 1).expand(-1, self.max_query_len, -1)
                in_new = in_range & torch.gather(self.custom_mask, 2, idx)
                # Padding query rows see key 0 so that no softmax row is empty.
                in_new[:, :, 0] |= (q_index[None, :] >= self.query_lens[:, None])
            self._attn_mask = (in_prefix | in_new).unsqueeze(1)
        return self._attn_mask


def build_paged_metadata(
    block_tables: Sequence[Sequence[int]],
    num_cached: Sequence[int],
    query_lens: Sequence[int],
    block_size: int,
    device: torch.device | str,
    custom_masks: Sequence[torch.Tensor | None] | None = None,
) -> PagedAttentionMetadata:
    """Host-side construction from plain lists.

    Sequence s has ``num_cached[s]`` tokens already in its cache and brings ``query_lens[s]`` new
    ones, stored at cache positions num_cached[s] .. num_cached[s] + query_lens[s] - 1.
    ``custom_masks[s]`` (optional) is a [query_lens[s], query_lens[s]] bool mask among the new tokens.
    """
    num_seqs = len(query_lens)
    max_q = max(query_lens)
    max_blocks = max(1, max(len(t) for t in block_tables))
    table = torch.zeros(num_seqs, max_blocks, dtype=torch.int64)
    slots, seq_index, query_index = [], [], []
    for s, (blocks, cached, q_len) in enumerate(zip(block_tables, num_cached, query_lens)):
        table[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
        positions = torch.arange(cached, cached + q_len)
        slots.append(table[s, positions // block_size] * block_size + positions % block_size)
        seq_index.append(torch.full((q_len,), s, dtype=torch.int64))
        query_index.append(torch.arange(q_len))
    custom = None
    if custom_masks is not None and any(m is not None for m in custom_masks):
        custom = torch.zeros(num_seqs, max_q, max_q, dtype=torch.bool)
        for s, (mask, q_len) in enumerate(zip(custom_masks, query_lens)):
            custom[s, :q_len, :q_len] = mask if mask is not None else torch.ones(q_len, q_len).tril().bool()
        custom = custom.to(device)
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    return PagedAttentionMetadata(
        slot_mapping=torch.cat(slots).to(device),
        block_tables=table.to(device),
        seq_lens=(torch.tensor(num_cached, dtype=torch.int64) + q_lens).to(device),
        query_lens=q_lens.to(device),
        token_seq_index=torch.cat(seq_index).to(device),
        token_query_index=torch.cat(query_index).to(device),
        max_query_len=max_q,
        block_size=block_size,
        custom_mask=custom,
    )
