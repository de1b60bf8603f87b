"""The paged attention backend against a naive per-sequence reference: ragged batches, block
boundaries, shuffled block tables, causal prefill/decode/verify and tree masks over a window of
speculative rows. Runs on the CPU, and on a GPU when one is present."""

import pytest
import torch

from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.layer import Attention

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference(q, keys, values, visible, scale):
    """q [n, h, d]; keys/values [kv_len, kvh, d]; visible [n, kv_len] bool -> [n, h, d]."""
    groups = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(groups, dim=1).double()
    v = values.repeat_interleave(groups, dim=1).double()
    scores = torch.einsum("nhd,khd->hnk", q.double(), k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnk,khd->nhd", scores.softmax(-1), v).to(q.dtype)


def random_tree_mask(q: int, window: int, g: torch.Generator) -> torch.Tensor:
    """[q, window]: each new row sees itself and a random subset of the rows before it."""
    mask = torch.rand(q, window, generator=g) < 0.5
    offset = window - q
    for i in range(q):
        mask[i, offset + i + 1 :] = False
        mask[i, offset + i] = True
    return mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["causal", "tree"])
def test_paged_attention_matches_reference(device, kind):
    g = torch.Generator().manual_seed(0 if kind == "causal" else 1)
    heads, kv_heads, dim, block, num_blocks = 6, 2, 16, 4, 64
    cached = [0, 3, 9, 13, 4]  # rows already in each sequence's cache (some not block-aligned)
    new = [7, 1, 5, 1, 6]  # prefill chunk, decode, verify, decode, verify
    # tree rows may also see up to 3 earlier speculative rows (a draft tree's window), never past the start
    windows = [
        q + (min(3, c) if kind == "tree" and i % 2 == 0 else 0)
        for i, (c, q) in enumerate(zip(cached, new))
    ]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for c, q in zip(cached, new):
        count = -(-(c + q) // block)
        tables.append(perm[used : used + count])
        used += count
    attn = Attention(heads, kv_heads, dim)
    k_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=g)
    v_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=g)
    attn.kv_cache = (k_cache.to(device), v_cache.to(device))
    total = sum(new)
    q = torch.randn(total, heads, dim, generator=g)
    k = torch.randn(total, kv_heads, dim, generator=g)
    v = torch.randn(total, kv_heads, dim, generator=g)
    masks = None
    if kind == "tree":
        masks = [
            random_tree_mask(qn, w, g).to(device) if w > qn or i % 2 == 0 else None
            for i, (qn, w) in enumerate(zip(new, windows))
        ]
    meta = build_paged_metadata(tables, cached, new, block, device, masks)
    with torch.no_grad(), forward_context(meta):
        out = attn(q.to(device), k.to(device), v.to(device)).cpu().view(total, heads, dim)

    offset = 0
    for s, (c, qn) in enumerate(zip(cached, new)):
        rows = torch.arange(c + qn)
        slots = torch.tensor(tables[s])[rows // block] * block + rows % block
        keys = k_cache.view(-1, kv_heads, dim)[slots].clone()
        values = v_cache.view(-1, kv_heads, dim)[slots].clone()
        keys[c:] = k[offset : offset + qn]
        values[c:] = v[offset : offset + qn]
        visible = torch.zeros(qn, c + qn, dtype=torch.bool)
        if masks is None or masks[s] is None:
            visible[:, :c] = True
            visible[:, c:] = torch.ones(qn, qn, dtype=torch.bool).tril()
        else:
            w = masks[s].shape[1]
            visible[:, : c + qn - w] = True
            visible[:, c + qn - w :] = masks[s].cpu()
        expected = reference(q[offset : offset + qn], keys, values, visible, attn.scale)
        torch.testing.assert_close(out[offset : offset + qn], expected, rtol=1e-4, atol=1e-4)
        # the new rows' k/v were written to their slots
        torch.testing.assert_close(
            attn.kv_cache[0].cpu().view(-1, kv_heads, dim)[slots[c:]], k[offset : offset + qn]
        )
        offset += qn
