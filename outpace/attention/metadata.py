"""What one forward's attention needs to know, built once per forward and shared by all layers.

Two kinds:
- ``PagedAttentionMetadata``: serving. Each sequence brings ``query_len`` new tokens whose KV is
  written into its paged cache blocks, and they attend to the sequence's cached prefix plus the
  new tokens allowed by a mask: causal by default, or a per-request tree mask for tree verify.
- ``DenseCausalMetadata``: training and references. ``batch`` equal-length sequences, no cache.

The forward itself performs no host synchronisation and no shape-dependent Python branching
beyond the two ints recorded here. ``build_paged_metadata`` builds the fields on the host from
lists (any mix of query lengths); ``uniform_paged_metadata`` (uniform_metadata.py) builds them on
the device, for batches where every sequence brings the same number of tokens, so that it can run
inside a CUDA-graph capture (see engine/cuda_graphs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from outpace.host_copies import pieces_to_device
from outpace.host_repeat import repeat_counts, run_positions


@dataclass
class DenseCausalMetadata:
    batch_size: int
    seq_len: int


@dataclass
class PagedAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot (block * block_size + offset)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with block 0
    seq_lens: torch.Tensor  # [num_seqs] int64: KV length after this forward
    query_lens: torch.Tensor  # [num_seqs] int64: new tokens per sequence
    token_seq_index: torch.Tensor  # [num_tokens] int64: sequence of each new token
    token_query_index: (
        torch.Tensor
    )  # [num_tokens] int64: index of each token among its sequence's new tokens
    max_query_len: int
    block_size: int
    # [num_seqs, max_query_len, window] bool: which of the sequence's last ``window`` KV rows
    # (the new tokens and, for tree drafting, earlier speculative rows) each new token may see;
    # rows before the window are always visible. None means plain causal.
    custom_mask: torch.Tensor | None = None
    # [num_tokens] int64: each new token's KV row, its position for a chain of new tokens (uniform metadata
    # computes it with the rest); None where the builder does not
    token_positions: torch.Tensor | None = None
    _attn_mask: torch.Tensor | None = None
    _window_masks: dict = field(
        default_factory=dict
    )  # sliding window -> its attn_mask, computed on first use
    _token_table: torch.Tensor | None = (
        None  # computed on first use, unless the builder has it (uniform)
    )

    @property
    def num_seqs(self) -> int:
        return self.block_tables.shape[0]

    def token_table(self) -> torch.Tensor:
        """[num_seqs, max_query_len] int32: the index in the batch of each (sequence, query index)
        token; entries past a sequence's query length are 0. Device operations only; computed on
        first use and reused by every layer of the forward."""
        if self._token_table is None:
            table = torch.zeros(
                self.num_seqs,
                self.max_query_len,
                dtype=torch.int32,
                device=self.slot_mapping.device,
            )
            table[self.token_seq_index, self.token_query_index] = torch.arange(
                self.slot_mapping.shape[0], dtype=torch.int32, device=table.device
            )
            self._token_table = table
        return self._token_table

    def check_sliding_window(self, sliding_window: int, positions: torch.Tensor | None) -> None:
        """Refuse what a sliding window (a query at position p sees only KV rows r > p - sliding_window,
        transformers' sliding_window_overlay) cannot be applied to exactly.

        The window compares a query's position (``positions`` [num_tokens], which a tree's rows need:
        theirs are not their KV rows) with KV row indices, which are the keys' positions before a
        custom mask's window. Inside it a visible key's position is at least the window's first row,
        and a query's at most that row + width - 1, so a mask at most sliding_window wide keeps every
        such key within every query's sliding window: the comparison is exact. Rows older than the
        window stay in the cache (masked, not freed)."""
        if positions is None:
            raise ValueError("a sliding window needs the queries' positions")
        if self.custom_mask is not None and self.custom_mask.shape[2] > sliding_window:
            raise ValueError(
                f"a custom attention mask {self.custom_mask.shape[2]} rows wide exceeds the sliding "
                f"window of {sliding_window} rows (draft fewer tokens per verify)"
            )

    def attn_mask(
        self, sliding_window: int | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[num_seqs, 1, max_query_len, max_kv_len] bool, True where attention is allowed; with
        ``sliding_window``, only KV rows r > p - sliding_window for a query at position p
        (``positions`` [num_tokens], see ``check_sliding_window``).

        Computed on first use (per window) and reused by every layer of the forward.
        """
        if sliding_window is not None:
            if sliding_window not in self._window_masks:
                self.check_sliding_window(sliding_window, positions)
                q_pos = positions.new_zeros(
                    self.num_seqs, self.max_query_len
                )  # [num_seqs, max_q]; padding: 0
                q_pos[self.token_seq_index, self.token_query_index] = positions
                kv_index = torch.arange(self.attn_mask().shape[-1], device=q_pos.device)  # [max_kv]
                in_window = (
                    kv_index[None, None, :] > q_pos[:, :, None] - sliding_window
                )  # [num_seqs, max_q, max_kv]
                # Padding rows (position 0) keep key 0; a real row keeps its own row.
                self._window_masks[sliding_window] = self.attn_mask() & in_window.unsqueeze(1)
            return self._window_masks[sliding_window]
        if self._attn_mask is None:
            max_kv = self.block_tables.shape[1] * self.block_size
            device = self.block_tables.device
            kv_index = torch.arange(max_kv, device=device)  # [max_kv]
            q_index = torch.arange(self.max_query_len, device=device)  # [max_q]
            if self.custom_mask is None:
                prefix_len = (self.seq_lens - self.query_lens)[:, None, None]  # [num_seqs, 1, 1]
                rel = kv_index[None, None, :] - prefix_len  # [num_seqs, 1, max_kv]
                mask = (rel < 0) | (rel <= q_index[None, :, None])  # [num_seqs, max_q, max_kv]
            else:
                window = self.custom_mask.shape[2]
                rel = kv_index[None, None, :] - (
                    self.seq_lens[:, None, None] - window
                )  # [num_seqs, 1, max_kv]
                idx = rel.clamp(0, window - 1).expand(-1, self.max_query_len, -1)
                mask = (rel < 0) | ((rel < window) & torch.gather(self.custom_mask, 2, idx))
            # Padding query rows see key 0 so that no softmax row is empty.
            mask[:, :, 0] |= q_index[None, :] >= self.query_lens[:, None]
            self._attn_mask = mask.unsqueeze(1)
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
    ones, stored at cache rows num_cached[s] .. num_cached[s] + query_lens[s] - 1.
    ``custom_masks[s]`` (optional, on ``device``) is a [query_lens[s], w_s] bool mask over the
    sequence's last w_s >= query_lens[s] KV rows (the new ones last); None means causal.
    """
    num_seqs = len(query_lens)
    max_q = max(query_lens)
    max_blocks = max(1, max(len(t) for t in block_tables))
    table = torch.zeros(num_seqs, max_blocks, dtype=torch.int64)
    for s, blocks in enumerate(block_tables):
        table[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    starts = torch.tensor(num_cached, dtype=torch.int64)
    seq_index = repeat_counts(range(num_seqs), q_lens)  # [num_tokens]
    query_index = run_positions(q_lens)  # [num_tokens]
    rows = run_positions(q_lens, starts)  # [num_tokens] each token's KV row
    slots = table[seq_index, rows // block_size] * block_size + rows % block_size
    custom = None
    if custom_masks is not None and any(m is not None for m in custom_masks):
        window = max(q if m is None else m.shape[1] for m, q in zip(custom_masks, query_lens))
        custom = torch.ones(num_seqs, max_q, window, dtype=torch.bool, device=device)
        for s, (mask, q) in enumerate(zip(custom_masks, query_lens)):
            if mask is None:
                mask = torch.ones(q, q, dtype=torch.bool, device=device).tril()
            custom[s, :q, window - mask.shape[1] :] = mask
    # one copy, queued behind the stream's kernels (six pageable copies each waited for them)
    slots, table, seq_lens, q_lens, seq_index, query_index = pieces_to_device(
        [slots, table, starts + q_lens, q_lens, seq_index, query_index], device
    )
    return PagedAttentionMetadata(
        slot_mapping=slots,
        block_tables=table,
        seq_lens=seq_lens,
        query_lens=q_lens,
        token_seq_index=seq_index,
        token_query_index=query_index,
        max_query_len=max_q,
        block_size=block_size,
        custom_mask=custom,
    )
