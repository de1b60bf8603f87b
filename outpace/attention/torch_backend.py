"""Portable attention on torch's scaled_dot_product_attention (CPU and GPU).

Paged path: write the new k/v into their cache slots, gather each sequence's blocks into a
padded [num_seqs, kv_heads, max_kv_len, head_dim] view, pad the queries to
[num_seqs, heads, max_query_len, head_dim], attend under the metadata's boolean mask (with a
layer's sliding window: ``PagedAttentionMetadata.attn_mask``), unpad. One code path serves
prefill, decode and (chain or tree) verify.

Batch-invariant mode on the CPU (attention/context.py ``batch_invariant``): each query attends alone, over only
the keys its mask row lets it see, gathered in order, so a chain token's or a tree node's row is the one decoding
it computes, whatever the batch or verify width (the CPU kernel's products and softmax sums follow the shape of
the whole call, and a node's masked siblings among its keys would change how they are blocked).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from outpace.attention.backend import KVCache, KVScales
from outpace.attention.context import batch_invariant
from outpace.attention.kv_quant import dequantize, store
from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata


class TorchAttentionBackend:
    name = "torch"

    def forward(
        self,
        q,
        k,
        v,
        kv_cache: KVCache | None,
        metadata,
        scale: float,
        sliding_window: int | None = None,
        positions: torch.Tensor | None = None,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        if isinstance(metadata, DenseCausalMetadata):
            return _dense_causal(q, k, v, metadata, scale, sliding_window)
        return _paged(q, k, v, kv_cache, metadata, scale, sliding_window, positions, kv_scales)


def _dense_causal(
    q, k, v, meta: DenseCausalMetadata, scale: float, sliding_window: int | None
) -> torch.Tensor:
    b, s = meta.batch_size, meta.seq_len

    def to_bhsd(x: torch.Tensor) -> torch.Tensor:  # [b * s, h, d] -> [b, h, s, d]
        return x.view(b, s, x.shape[1], x.shape[2]).transpose(1, 2)

    mask = None
    if (
        sliding_window is not None
    ):  # each row's position is its index: causal, and i - j < sliding_window
        offset = torch.arange(s, device=q.device)[:, None] - torch.arange(
            s, device=q.device
        )  # [s, s]: i - j
        mask = (offset >= 0) & (offset < sliding_window)
    out = F.scaled_dot_product_attention(
        to_bhsd(q),
        to_bhsd(k),
        to_bhsd(v),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2).reshape(q.shape)


def _paged(
    q,
    k,
    v,
    kv_cache: KVCache,
    meta: PagedAttentionMetadata,
    scale: float,
    sliding_window: int | None,
    positions: torch.Tensor | None,
    kv_scales: KVScales | None,
) -> torch.Tensor:
    k_cache, v_cache = kv_cache  # [num_blocks, block_size, kv_heads, head_dim]
    k_scale, v_scale = kv_scales or (None, None)
    store(k_cache, meta.slot_mapping, k, k_scale)
    store(v_cache, meta.slot_mapping, v, v_scale)
    return attend_paged(
        q,
        dequantize(gather_blocks(k_cache, meta), k_scale, q.dtype),
        dequantize(gather_blocks(v_cache, meta), v_scale, q.dtype),
        meta,
        scale,
        sliding_window,
        positions,
    )


def gather_blocks(cache: torch.Tensor, meta: PagedAttentionMetadata) -> torch.Tensor:
    """cache [num_blocks, block_size, kv_heads, dim] -> each sequence's rows [num_seqs, kv_heads, max_kv_len, dim]
    (a copy; rows past a sequence's length are whatever its padding blocks hold: ``attn_mask`` hides them)."""
    # NOTE: index_select copies whole blocks; advanced indexing (cache[block_tables]) is 3-5x slower on the CPU.
    blocks = cache.index_select(0, meta.block_tables.view(-1))
    return blocks.view(meta.num_seqs, -1, cache.shape[2], cache.shape[3]).transpose(1, 2)


def attend_paged(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [num_tokens, heads, qk_dim]; k [num_seqs, kv_heads, max_kv_len, qk_dim] and v [num_seqs, kv_heads,
    max_kv_len, v_dim], each sequence's KV rows (``gather_blocks``, the new tokens' rows already written)
    -> [num_tokens, heads, v_dim], under the metadata's mask (causal, tree, sliding window)."""
    n, heads = meta.num_seqs, q.shape[1]
    if batch_invariant() and not q.is_cuda and q.shape[0] > 0:
        return _each_query_alone(q, k, v, meta, meta.attn_mask(sliding_window, positions), scale)
    # Every sequence brings max_query_len tokens (decode, chain verify): the queries are already a padded batch.
    uniform = q.shape[0] == n * meta.max_query_len
    if uniform:
        q_pad = q.view(n, meta.max_query_len, heads, q.shape[2])
    else:
        q_pad = q.new_zeros(n, meta.max_query_len, heads, q.shape[2])
        q_pad[meta.token_seq_index, meta.token_query_index] = q
    # NOTE: on CUDA not cuDNN: on the H100 it rebuilds its graph on every call (~0.5 ms of host time per
    # layer). On the CPU torch's own choice, its flash kernel, is about 3x faster than MATH for a decode row.
    with (
        sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
        if q.is_cuda
        else nullcontext()
    ):
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),
            k,
            v,
            attn_mask=meta.attn_mask(sliding_window, positions),
            scale=scale,
            enable_gqa=True,
        )
    out = out.transpose(1, 2)  # [num_seqs, max_query_len, heads, v_dim]
    return (
        out.reshape(q.shape[0], heads, -1)
        if uniform
        else out[meta.token_seq_index, meta.token_query_index]
    )


def _each_query_alone(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: PagedAttentionMetadata,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``attend_paged`` in batch-invariant mode on the CPU (module docstring): each query [1, heads, 1, dim]
    over the keys its mask row allows (a chain's prefix and new tokens up to it; a tree node's prefix and
    ancestors; a sliding window's last rows), gathered in their order, with no mask: a decoded token sees the
    same keys in the same order."""
    seq, row = meta.token_seq_index, meta.token_query_index  # [num_tokens] each
    out = []
    for i, (s, r) in enumerate(zip(seq.tolist(), row.tolist())):
        # [visible] the key rows this query sees, in order
        keys = mask[s, 0, r].nonzero().squeeze(1)
        out.append(
            F.scaled_dot_product_attention(
                q[i].view(1, q.shape[1], 1, q.shape[2]),
                k[s : s + 1, :, keys],
                v[s : s + 1, :, keys],
                scale=scale,
                enable_gqa=True,
            )
        )
    return torch.cat(out).view(q.shape[0], q.shape[1], -1)
