"""The MLA Triton kernel (attention/mla_kernels.py) against the torch path of layers/mla.py (gathered latent
rows, attend_paged under the metadata's mask) in Triton's interpreter (fp32 on the CPU; bf16 at the
DeepSeek-V2-Lite shape on the GPU): decode, chain verify, tree masks over a window of speculative rows,
ragged batches mixing prefill chunks with decode, shuffled block tables with odd block sizes, kv_lora_rank 36
(not a power of two), head counts that do not divide the kernel's tile, forced split counts (with empty
splits), the query latent in parts with W_UV applied in the merge (the fused block's form); the attention
layer choosing the kernel under the Triton backend; and batch-invariant mode: rows alone, in a chain and in
a batch bit-identical, a draft tree's nodes bit-identical to their chains and their decodes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.attention import build_paged_metadata, forward_context, mla_kernels
from outpace.attention.mla_kernels import mla_attention_up, mla_paged_attention
from outpace.attention.registry import get_backend
from outpace.attention.torch_backend import attend_paged, gather_blocks
from outpace.layers.mla import MLAShape, MultiHeadLatentAttention
from outpace.layers.rotary import RotaryEmbedding

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (cached rows, new tokens, tree window or None) per sequence
LAYOUTS = {
    "decode": ([37, 5, 130, 16], [1, 1, 1, 1], None),
    "verify": ([20, 45, 7], [5, 5, 5], None),
    "tree": ([30, 12, 50], [5, 8, 3], [9, 8, 7]),
    "ragged": ([0, 17, 64, 9], [40, 25, 1, 4], None),
    "ragged_tree": ([0, 33, 8], [20, 1, 6], [None, 3, 10]),
}


def tree_mask(q: int, window: int, g: torch.Generator) -> torch.Tensor:
    """[q, window] bool: a random tree over the window whose last q nodes are the new tokens; each row
    sees its node and the node's ancestors."""
    seen = torch.zeros(window, window, dtype=torch.bool)
    for node in range(window):
        parent = int(torch.randint(-1, node, (1,), generator=g)) if node else -1
        if parent >= 0:
            seen[node] = seen[parent]
        seen[node, node] = True
    return seen[window - q :]


def make_meta(layout: str, block_size: int, g: torch.Generator):
    return make_meta_from(LAYOUTS[layout], block_size, g)


def make_meta_from(layout, block_size: int, g: torch.Generator):
    """(metadata, number of cache blocks) of a layout (cached rows, new tokens, windows), the blocks
    shuffled with gaps."""
    cached, new, windows = layout
    lengths = [c + q for c, q in zip(cached, new)]
    needed = [-(-n // block_size) for n in lengths]
    blocks = torch.randperm(sum(needed) + 3, generator=g)[: sum(needed)].tolist()  # shuffled, gaps
    tables, start = [], 0
    for k in needed:
        tables.append(blocks[start : start + k])
        start += k
    masks = None
    if windows is not None:
        masks = [None if w is None else tree_mask(q, w, g).to(DEVICE) for q, w in zip(new, windows)]
    meta = build_paged_metadata(tables, cached, new, block_size, DEVICE, masks)
    return meta, sum(needed) + 3


def torch_reference(q_latent, q_rope, cache, meta, scale):
    rank = q_latent.shape[2]
    gathered = gather_blocks(cache, meta).to(q_latent.dtype)
    return attend_paged(
        torch.cat((q_latent, q_rope), dim=-1), gathered, gathered[..., :rank], meta, scale
    )


# (layout, block size, heads, forced split count): each layout at two of the shapes (16, 4), (3, 3) and
# (5, 6), one of them an odd block size; 4 heads divide the kernel's 16-row tile, 3 and 6 do not
CASES = [
    ("decode", 16, 4, None),
    ("decode", 5, 6, None),
    ("verify", 3, 3, None),
    ("verify", 5, 6, None),
    ("tree", 3, 3, None),
    ("tree", 5, 6, None),
    ("ragged", 16, 4, None),
    ("ragged", 3, 3, None),
    ("ragged_tree", 16, 4, None),
    ("ragged_tree", 5, 6, None),  # (the heuristic's one split: as a forced 1)
]
# forced: one split (no partials), a few, and more than the short sequences' KV tiles (empty splits)
CASES += [("verify", 5, 6, 1), ("verify", 5, 6, 7), ("ragged_tree", 5, 6, 3)]


@pytest.mark.parametrize("layout, block_size, heads, num_splits", CASES)
def test_kernel_equals_the_torch_path(layout, block_size, heads, num_splits):
    g = torch.Generator().manual_seed(hash((layout, block_size, heads)) % 1000)
    rank, rope = 36, 8
    meta, num_blocks = make_meta(layout, block_size, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, block_size, 1, rank + rope, generator=g).to(DEVICE)
    q_latent = torch.randn(n, heads, rank, generator=g).to(DEVICE)
    q_rope = torch.randn(n, heads, rope, generator=g).to(DEVICE)
    expected = torch_reference(q_latent, q_rope, cache, meta, 0.3)
    got = mla_paged_attention(q_latent, q_rope, cache, meta, 0.3, num_splits=num_splits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# (None: the heuristic's 2 splits for decode and verify; 1 for the tree, which its forced 1 stands for)
@pytest.mark.parametrize(
    "layout, num_splits",
    [("decode", None), ("decode", 7), ("verify", None), ("verify", 3), ("tree", 1), ("tree", 7)],
)
def test_query_parts_and_the_up_projection_in_the_merge(layout, num_splits):
    """mla_attention_up: the query latent as the sum of two parts, each head's attended latent through its
    own up projection [heads, 7, R] (a strided view, as W_UV is of kv_b_proj's weight) in the merge."""
    g = torch.Generator().manual_seed(len(layout))
    rank, rope, heads = 36, 8, 5
    meta, num_blocks = make_meta(layout, 5, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 5, 1, rank + rope, generator=g).to(DEVICE)
    parts = torch.randn(2, n, heads, rank, generator=g).to(DEVICE)
    q_rope = torch.randn(n, heads, rope, generator=g).to(DEVICE)
    up = torch.randn(heads, 10, rank, generator=g).to(DEVICE)[:, 3:]  # [heads, 7, rank]
    attended = torch_reference(parts.sum(0), q_rope, cache, meta, 0.3)
    expected = torch.einsum("thr,hvr->thv", attended, up)
    got = mla_attention_up(parts, q_rope, cache, meta, 0.3, up, num_splits=num_splits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("min_rows", [16, 48, 1000])
def test_the_heuristic_s_shortest_split(min_rows, monkeypatch):
    """The split-KV heuristic's minimum split length (``min_split_rows``, rounded down to BLOCK_N): the
    attention and the merge agree on which splits ran, whether a 131-row sequence takes one split or
    several of 48 rows."""
    monkeypatch.setattr(mla_kernels, "min_split_rows", min_rows)
    g = torch.Generator().manual_seed(min_rows)
    rank, rope, heads = 36, 8, 5
    meta, num_blocks = make_meta("decode", 5, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 5, 1, rank + rope, generator=g).to(DEVICE)
    parts = torch.randn(2, n, heads, rank, generator=g).to(DEVICE)
    q_rope = torch.randn(n, heads, rope, generator=g).to(DEVICE)
    up = torch.randn(heads, 7, rank, generator=g).to(DEVICE)
    attended = torch_reference(parts.sum(0), q_rope, cache, meta, 0.3)
    expected = torch.einsum("thr,hvr->thv", attended, up)
    got = mla_attention_up(parts, q_rope, cache, meta, 0.3, up)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_strided_queries_and_tokens_in_any_order():
    """q_rope as a slice of a wider tensor (as the layer's split gives it), tokens of a verify batch
    permuted in the batch (the token table finds them)."""
    g = torch.Generator().manual_seed(5)
    meta, num_blocks = make_meta("verify", 16, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 16, 1, 40, generator=g).to(DEVICE)
    wide = torch.randn(n, 4, 50, generator=g).to(DEVICE)
    q_latent, q_rope = wide[..., :32], wide[..., 32:40]
    expected = torch_reference(
        q_latent, q_rope, cache, meta, 0.2
    )  # (attend_paged takes the batch in order)
    order = torch.randperm(n, generator=g).to(DEVICE)
    meta.slot_mapping, meta.token_seq_index, meta.token_query_index = (
        meta.slot_mapping[order],
        meta.token_seq_index[order],
        meta.token_query_index[order],
    )
    got = mla_paged_attention(
        wide[order][..., :32], wide[order][..., 32:40], cache, meta, 0.2, num_splits=2
    )
    torch.testing.assert_close(got, expected[order], rtol=1e-5, atol=1e-5)


# The merge (``_combine_kernel``) alone ----------------------------------------------------------------------------

# (cached rows, new tokens, tree window or None) per sequence, as LAYOUTS: verify widths 2 .. 8, and short
# sequences beside a long one (a wide block table: most splits do not run for them)
MERGE_LAYOUTS = {
    **LAYOUTS,
    "widths": ([3, 40, 17, 90, 6, 25, 61], [2, 3, 4, 5, 6, 7, 8], None),
    "long_table": ([300, 4, 9], [1, 1, 2], None),
}


def splits_ran(meta, heads, num_splits, block_m, block_n, min_split) -> torch.Tensor:
    """[num_tokens, heads]: the splits _mla_kernel runs for each (token, head) row's tile, from the module
    docstring's geometry: the tile's last row's KV end (a tree mask: the sequence's), split j covering
    [j * L, (j + 1) * L) with L = max(roundup(ceil(kv_end / num_splits), block_n), min_split), split 0 always."""
    seq, q = meta.token_seq_index.cpu(), meta.token_query_index.cpu()
    seq_len, query_len = meta.seq_lens.cpu()[seq], meta.query_lens.cpu()[seq]
    tile = (q[:, None] * heads + torch.arange(heads)) // block_m  # [num_tokens, heads]
    last_query = torch.minimum((tile * block_m + block_m - 1) // heads, query_len[:, None] - 1)
    if meta.custom_mask is None:
        kv_end = (seq_len - query_len)[:, None] + last_query + 1
    else:
        kv_end = seq_len[:, None].expand(-1, heads)
    split_len = (-(-kv_end // num_splits) + block_n - 1) // block_n * block_n
    split_len = split_len.clamp(min=min_split)
    return (-(-kv_end // split_len)).clamp(min=1)


def eager_merge(part_acc, part_max, part_sum, ran, up):
    """The merge in torch: sum_j 2^(m_j - M) acc_j / sum_j 2^(m_j - M) l_j over the splits that ran (M their
    largest max), through up [heads, OUT, R] when given."""
    splits = torch.arange(part_max.shape[0])[:, None, None]  # [num_splits, 1, 1]
    ran = splits < ran  # [num_splits, num_tokens, heads]
    m = torch.where(ran, part_max, float("-inf"))
    weight = torch.exp2(m - m.amax(0))  # [num_splits, num_tokens, heads]
    attended = (weight[..., None] * torch.where(ran[..., None], part_acc, 0.0)).sum(0)
    attended = attended / (weight * torch.where(ran, part_sum, 0.0)).sum(0)[..., None]
    return attended if up is None else torch.einsum("thr,hvr->thv", attended, up)


# The split geometries (block_m, min_split): 16-row tiles and splits, or 32-row tiles and splits of 48 rows at
# least (the 301-row sequence's splits then 7 at most: one group)
GEOMETRIES = [(16, 16), (32, 48)]
# (num_splits, W_UV, batch-invariant launch): BLOCK_T 16 tokens (at most the batch's), 2, the mode's 4, and 1
# (past 8 splits)
MERGE_CONFIGS = [(1, True, False), (5, False, False), (16, True, True), (40, True, False)]
# (layout, num_splits, W_UV, batch-invariant launch, block_m, min_split): the widths and the tree under both
# geometries, each config under both (one token a program, 40 splits: the tree's and the long table's)
MERGE_CASES = [
    ("widths", 1, True, False, 16, 16),
    ("widths", 5, False, False, 32, 48),
    ("widths", 16, True, True, 16, 16),
    ("tree", 1, True, False, 32, 48),
    ("tree", 5, False, False, 16, 16),
    ("tree", 16, True, True, 32, 48),
    ("tree", 40, True, False, 16, 16),
]
MERGE_CASES += [  # the long table's 4 tokens: every config under both geometries
    ("long_table", *config, *geometry) for config in MERGE_CONFIGS for geometry in GEOMETRIES
]
MERGE_CASES += [
    ("long_table", 40, False, True, 16, 16),  # the mode's groups of 4 splits: 19 splits, 5 groups
    ("long_table", 40, False, True, 32, 48),
    ("long_table", 70, False, False, 16, 16),  # two groups of up to 16 splits, without W_UV
    ("ragged", 3, True, False, 16, 16),  # a prefill chunk's rows: 1 to 3 splits, mixed in blocks
]


@pytest.mark.parametrize("layout, num_splits, with_up, invariant, block_m, min_split", MERGE_CASES)
def test_the_merge_equals_an_eager_merge(
    layout, num_splits, with_up, invariant, block_m, min_split
):
    """_combine_kernel alone on random partials: the splits that ran merged (one group of up to 16 splits a
    program at one token, several groups past 16 splits, as the 301-row sequence's 19 splits of 16 rows, or
    under the mode's fixed 4 tokens a program), the ones that did not run never read (NaN there), neutral
    partials where a split saw nothing."""
    g = torch.Generator().manual_seed(num_splits * block_m + len(layout))
    heads, rank, block_n = 5, 36, 16
    meta, _ = make_meta_from(MERGE_LAYOUTS[layout], 5, g)
    num_tokens = meta.slot_mapping.shape[0]
    ran = splits_ran(meta, heads, num_splits, block_m, block_n, min_split)  # [num_tokens, heads]
    shape = (num_splits, num_tokens, heads)
    part_max = torch.randn(*shape, generator=g) * 4
    part_sum = torch.rand(*shape, generator=g) * 30 + 1
    part_acc = torch.randn(*shape, rank, generator=g) * part_sum[..., None]
    split = torch.arange(num_splits)[:, None, None]
    neutral = (torch.rand(*shape, generator=g) < 0.2) & (split > 0)  # saw none of its rows
    for tensor, neutral_value in ((part_max, -1.0e30), (part_sum, 0.0), (part_acc, 0.0)):
        tensor[neutral] = neutral_value
        tensor[split >= ran] = float("nan")  # not run: never written
    up = (
        torch.randn(heads, 10, rank, generator=g)[:, 3:] if with_up else None
    )  # [heads, 7, rank] strided
    expected = eager_merge(part_acc, part_max, part_sum, ran, up)
    out = torch.empty(num_tokens, heads, rank if up is None else 7, device=DEVICE)
    partials = tuple(t.to(DEVICE) for t in (part_acc, part_max, part_sum))
    up = None if up is None else up.to(DEVICE)
    mla_kernels._combine(
        partials, up, out, meta, num_splits, block_m, block_n, min_split, invariant
    )
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


# (the widths at 4 forced splits, of 16 or 32 rows: 1 to 3 run for a sequence's tiles, some empty)
@pytest.mark.parametrize(
    "layout, num_splits",
    [("widths", None), ("widths", 4), ("long_table", None), ("long_table", 40)],
)
def test_verify_widths_and_short_sequences_in_a_long_table(layout, num_splits):
    """The attention and its merge end to end, with and without W_UV: verify widths 2 .. 8, and short
    sequences beside a 300-row one (of 40 forced splits, 19 of 16 rows run for it, two groups of up to 16;
    one for the others)."""
    g = torch.Generator().manual_seed(len(layout))
    rank, rope, heads = 36, 8, 3
    meta, num_blocks = make_meta_from(MERGE_LAYOUTS[layout], 5, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 5, 1, rank + rope, generator=g).to(DEVICE)
    q_latent = torch.randn(n, heads, rank, generator=g).to(DEVICE)
    q_rope = torch.randn(n, heads, rope, generator=g).to(DEVICE)
    up = torch.randn(heads, 7, rank, generator=g).to(DEVICE)
    expected = torch_reference(q_latent, q_rope, cache, meta, 0.3)
    got = mla_paged_attention(q_latent, q_rope, cache, meta, 0.3, num_splits=num_splits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    got = mla_attention_up(q_latent[None], q_rope, cache, meta, 0.3, up, num_splits=num_splits)
    torch.testing.assert_close(
        got, torch.einsum("thr,hvr->thv", expected, up), rtol=1e-5, atol=1e-5
    )


def test_the_merge_launch(monkeypatch):
    """_combine_launch at DeepSeek-V2-Lite's shape (16 heads, W_UV's 128 rows) on an H200's 132 SMs: batch 1
    takes one token a program, its splits in groups of 16, in 128 programs (16 W_UV rows each); batch 8 one
    token a program too (64 rows each: 256 programs); batch 32 over 9 splits 4 tokens a program (128 (token,
    head) rows: ``combine_token_heads``), 64 tokens over 5 splits 8. At DeepSeek-V3's 128 heads a program takes
    a batch of 8 whole, and 16 of a batch of 32. In batch-invariant mode the launch follows neither the batch
    nor the split count."""
    monkeypatch.setattr(mla_kernels, "num_sms", lambda device: 132)
    device = torch.device("cpu")
    assert mla_kernels._combine_launch(1, 16, 128, 64, False, device) == (1, 16)
    assert mla_kernels._combine_launch(8, 16, 128, 33, False, device) == (1, 64)
    assert mla_kernels._combine_launch(32, 16, 128, 9, False, device) == (4, 64)
    assert mla_kernels._combine_launch(64, 16, 128, 5, False, device) == (8, 64)
    assert mla_kernels._combine_launch(8, 128, 128, 9, False, device)[0] == 8
    assert mla_kernels._combine_launch(32, 128, 128, 3, False, device)[0] == 16
    invariant = {
        mla_kernels._combine_launch(tokens, 16, 128, splits, True, device)
        for tokens in (1, 8, 40)
        for splits in (1, 3, 9)
    }
    assert invariant == {(mla_kernels._INVARIANT_COMBINE_TOKENS, 16)}


def absorbed_layer() -> MultiHeadLatentAttention:
    """A small MLA layer (3 heads, latent 36, rope 8) with random weights, always in its absorbed form."""
    shape = MLAShape(
        hidden_size=24,
        num_heads=3,
        q_lora_rank=None,
        kv_lora_rank=36,
        qk_nope_head_dim=6,
        qk_rope_head_dim=8,
        v_head_dim=5,
        scale=0.25,
    )
    torch.manual_seed(0)
    layer = MultiHeadLatentAttention(shape, RotaryEmbedding(8, 512, 10000.0)).to(DEVICE)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    layer.expand_min_query_len = 10**6  # always absorbed
    return layer


@pytest.mark.parametrize("layout", ["decode", "tree", "ragged"])
def test_the_layer_chooses_the_kernel_under_the_triton_backend(layout, monkeypatch):
    """MultiHeadLatentAttention's absorbed form: the same output and cache under either backend, and the
    kernel runs under the Triton one (and only there)."""
    import outpace.attention.mla_kernels as kernels

    g = torch.Generator().manual_seed(11)
    layer = absorbed_layer()
    meta, num_blocks = make_meta(layout, 16, g)
    n = meta.slot_mapping.shape[0]
    x = torch.randn(n, 24, generator=g).to(DEVICE)
    positions = (meta.seq_lens - meta.query_lens)[meta.token_seq_index] + meta.token_query_index
    calls = []
    real = kernels.mla_paged_attention
    monkeypatch.setattr(
        kernels, "mla_paged_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    outs = {}
    for backend in ("torch", "triton"):
        layer.bind_cache(num_blocks, 16, torch.float32, DEVICE)
        with torch.no_grad(), forward_context(meta, get_backend(backend)):
            outs[backend] = (layer(positions, x), layer.cache_rows.clone())
        assert len(calls) == (backend == "triton")
    torch.testing.assert_close(outs["triton"][0], outs["torch"][0], rtol=1e-5, atol=1e-5)
    assert torch.equal(outs["triton"][1], outs["torch"][1])


@pytest.mark.gpu  # bf16 at the DeepSeek-V2-Lite shape: GPU only
@pytest.mark.parametrize("layout", ["decode", "verify", "tree"])
def test_bf16_at_the_v2_lite_shape(layout):
    g = torch.Generator().manual_seed(2)
    meta, num_blocks = make_meta(layout, 16, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 16, 1, 576, generator=g).to(DEVICE, torch.bfloat16)
    q_latent = torch.randn(n, 16, 512, generator=g).to(DEVICE, torch.bfloat16)
    q_rope = torch.randn(n, 16, 64, generator=g).to(DEVICE, torch.bfloat16)
    expected = torch_reference(q_latent.float(), q_rope.float(), cache.float(), meta, 192**-0.5)
    got = mla_paged_attention(q_latent, q_rope, cache, meta, 192**-0.5).float()
    assert ((got - expected).norm() / expected.norm()).item() < 2e-2


def test_deepseek_greedy_tokens_under_the_triton_backend(tmp_path):
    """A small DeepSeek-V3 target end to end through the engine: the same greedy tokens with the MLA kernel
    (decode, and prefill chunks short enough for the absorbed form) as with the torch path."""
    from helpers.deepseek_models import make_hf_deepseek
    from helpers.hf_models import save_hf_model
    from outpace import LLM, SamplingParams

    path = str(save_hf_model(make_hf_deepseek("v3-plain"), tmp_path))
    prompts, params = (
        [[1, 5, 2, 7, 3], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2]],
        SamplingParams(temperature=0, max_tokens=6),
    )
    outs = {
        backend: [
            o.token_ids
            for o in LLM(
                path, attention_backend=backend, block_size=4, device=DEVICE, dtype="float32"
            ).generate(prompts, params)
        ]
        for backend in ("torch", "triton")
    }
    assert outs["triton"] == outs["torch"]


# Batch-invariant mode ------------------------------------------------------------------------------------------------

# Final lengths of the sequences the invariance tests cut their calls from (one shared cache).
INVARIANT_LENGTHS = [100, 75, 300]


class LatentSequences:
    """Sequences over one shared latent cache with a query per (sequence, position), so that a token has
    the same query and the same visible rows in every call that holds it."""

    def __init__(self, lengths, block_size, heads, rank, rope, dtype, g):
        needed = [-(-n // block_size) for n in lengths]
        blocks = torch.randperm(sum(needed) + 3, generator=g)[: sum(needed)].tolist()
        starts = torch.tensor([0] + needed).cumsum(0).tolist()
        self.tables = [blocks[a:b] for a, b in zip(starts, starts[1:])]  # each its full length
        self.block_size = block_size
        self.cache = torch.randn(sum(needed) + 3, block_size, 1, rank + rope, generator=g)
        self.cache = self.cache.to(DEVICE, dtype)  # [num_blocks, block_size, 1, rank + rope]
        self.q_latent = [
            torch.randn(n, heads, rank, generator=g).to(DEVICE, dtype) for n in lengths
        ]
        self.q_rope = [torch.randn(n, heads, rope, generator=g).to(DEVICE, dtype) for n in lengths]

    def attend(self, calls, scale):
        """calls: [(sequence, cached rows, new tokens)] in one batch -> (the kernel's output, the torch
        reference), one row per new token in the calls' order."""
        meta = build_paged_metadata(
            [self.tables[s] for s, _, _ in calls],
            [c for _, c, _ in calls],
            [q for _, _, q in calls],
            self.block_size,
            DEVICE,
        )
        q_latent = torch.cat([self.q_latent[s][c : c + q] for s, c, q in calls])
        q_rope = torch.cat([self.q_rope[s][c : c + q] for s, c, q in calls])
        got = mla_paged_attention(q_latent, q_rope, self.cache, meta, scale)
        expected = torch_reference(
            q_latent.float(), q_rope.float(), self.cache.float(), meta, scale
        )
        return got, expected


def invariance_pairs(seqs, scale):
    """(alone, in company) output pairs that batch invariance makes bit-identical: (a) sequence 0's tokens
    at rows 90 .. 93 decoded alone and inside a verify chain of 4; (b) its decode at row 93 and that chain
    as the only sequence and among other sequences of other lengths (a wider block table), and all of
    them against the torch reference."""
    pairs, references = [], []

    def call(calls):
        got, expected = seqs.attend(calls, scale)
        references.append((got, expected))
        return got

    chain = call([(0, 90, 4)])
    for i in range(4):
        pairs.append((call([(0, 90 + i, 1)]), chain[i : i + 1]))
    batch = call(
        [(1, 60, 5), (0, 93, 1), (2, 290, 1), (0, 90, 4)]
    )  # (sequence 0 twice: reads only)
    pairs.append((call([(0, 93, 1)]), batch[5:6]))
    pairs.append((chain, batch[7:11]))
    return pairs, references


@pytest.mark.parametrize("split_rows", [32, 64])
def test_batch_invariant_rows_equal_alone_in_a_chain_and_in_a_batch(split_rows, monkeypatch):
    """Under the mode a row's bits do not depend on the batch: a token decoded alone equals the same
    token inside a verify chain, and a sequence alone equals it among longer and shorter ones, over
    contexts of several splits (split_rows small for the interpreter); both equal the torch path."""
    from outpace.attention.context import forward_settings

    monkeypatch.setattr(mla_kernels, "invariant_split_rows", split_rows)
    g = torch.Generator().manual_seed(split_rows)
    seqs = LatentSequences(INVARIANT_LENGTHS, 5, 3, 36, 8, torch.float32, g)
    with forward_settings(True):
        pairs, references = invariance_pairs(seqs, 0.3)
    for alone, in_company in pairs:
        assert torch.equal(alone, in_company)
    for got, expected in references:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_batch_invariant_splits_give_their_bits_whichever_program_takes_them(monkeypatch):
    """Under the mode a row tile's splits (32 rows: several a sequence, most of the table's past its rows)
    walked by one program in turn, by three, or by one program each (``invariant_programs``): the same
    bits, in a ragged batch of decode and verify rows."""
    from outpace.attention.context import forward_settings

    monkeypatch.setattr(mla_kernels, "invariant_split_rows", 32)
    g = torch.Generator().manual_seed(11)
    seqs = LatentSequences(INVARIANT_LENGTHS, 5, 3, 36, 8, torch.float32, g)
    outs = []
    for programs in (1, 3, 1000):
        monkeypatch.setattr(
            mla_kernels,
            "invariant_programs",
            lambda splits, tiles, device, p=programs: min(splits, p),
        )
        with forward_settings(True):
            pairs, _ = invariance_pairs(seqs, 0.3)
        outs.append(torch.cat([a for pair in pairs for a in pair]))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_the_fast_path_is_not_batch_invariant_at_those_shapes(monkeypatch):
    """What the mode fixes: the split-KV heuristic cuts a row's KV where its batch says (alone, 8 splits
    of 16 rows at this minimum; in the batch of 4 sequences 2 splits, of half the row's context each),
    so the pairs above differ in some bits (while equal to the torch path within tolerance). At the
    default 64-row minimum these contexts happen to get 64-row splits in every call on the CPU's 4
    "SMs" (the GPU's too, here, for the same grids there); on an H200 (132 SMs) the heuristic's splits
    part from 2112-row contexts in a batch of 8."""
    monkeypatch.setattr(mla_kernels, "min_split_rows", 16)
    monkeypatch.setattr(mla_kernels, "num_sms", lambda device: 4)
    g = torch.Generator().manual_seed(32)
    seqs = LatentSequences(INVARIANT_LENGTHS, 5, 3, 36, 8, torch.float32, g)
    pairs, references = invariance_pairs(seqs, 0.3)
    assert not all(torch.equal(alone, in_company) for alone, in_company in pairs)
    for got, expected in references:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_batch_invariant_mode_refuses_what_it_does_not_cover(monkeypatch):
    """A forced split count and a split length off the KV tiles are refused by name under the mode."""
    from outpace.attention.context import forward_settings

    g = torch.Generator().manual_seed(3)
    meta, num_blocks = make_meta("verify", 5, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 5, 1, 44, generator=g).to(DEVICE)
    q_latent, q_rope = torch.randn(n, 3, 36).to(DEVICE), torch.randn(n, 3, 8).to(DEVICE)
    with forward_settings(True):
        with pytest.raises(ValueError, match="num_splits cannot be forced"):
            mla_paged_attention(q_latent, q_rope, cache, meta, 0.3, num_splits=2)
        monkeypatch.setattr(mla_kernels, "invariant_split_rows", 40)
        with pytest.raises(ValueError, match="invariant_split_rows=40"):
            mla_paged_attention(q_latent, q_rope, cache, meta, 0.3)


def test_batch_invariant_query_parts_and_up_projection(monkeypatch):
    """mla_attention_up under the mode: a decode row alone equals it inside a verify chain and a batch."""
    from outpace.attention.context import forward_settings

    monkeypatch.setattr(mla_kernels, "invariant_split_rows", 32)
    g = torch.Generator().manual_seed(8)
    seqs = LatentSequences(INVARIANT_LENGTHS, 5, 3, 36, 8, torch.float32, g)
    up = torch.randn(3, 7, 36, generator=g).to(DEVICE)  # [heads, 7, rank]

    def attend_up(calls):
        meta = build_paged_metadata(
            [seqs.tables[s] for s, _, _ in calls],
            [c for _, c, _ in calls],
            [q for _, _, q in calls],
            5,
            DEVICE,
        )
        q_latent = torch.cat([seqs.q_latent[s][c : c + q] for s, c, q in calls])
        q_rope = torch.cat([seqs.q_rope[s][c : c + q] for s, c, q in calls])
        parts = torch.stack((q_latent * 0.5, q_latent * 0.5))  # [2, n, heads, rank]
        return mla_attention_up(parts, q_rope, seqs.cache, meta, 0.3, up)

    with forward_settings(True):
        alone = attend_up([(0, 92, 1)])
        chain = attend_up([(0, 90, 4)])
        batch = attend_up([(1, 60, 5), (0, 90, 4), (2, 290, 1)])
    assert torch.equal(alone, chain[2:3])
    assert torch.equal(chain, batch[5:9])


@pytest.mark.gpu  # bf16 at the DeepSeek-V2-Lite shape: GPU only
def test_bf16_batch_invariant_at_the_v2_lite_shape():
    """The invariance test in bf16 at DeepSeek-V2-Lite's shape (16 heads, 512 + 64) with the mode's own
    512-row splits over contexts of up to 3 splits: rows alone, in a chain and in a batch bit-identical,
    and close to the float32 torch path."""
    from outpace.attention.context import forward_settings

    g = torch.Generator().manual_seed(4)
    lengths = [1100, 700, 1400]
    seqs = LatentSequences(lengths, 16, 16, 512, 64, torch.bfloat16, g)
    with forward_settings(True):
        alone = [seqs.attend([(0, 1090 + i, 1)], 192**-0.5) for i in range(4)]
        chain, expected = seqs.attend([(0, 1090, 4)], 192**-0.5)
        batch, _ = seqs.attend([(1, 600, 5), (0, 1090, 4), (2, 1390, 1)], 192**-0.5)
    for i, (row, _) in enumerate(alone):
        assert torch.equal(row, chain[i : i + 1])
    assert torch.equal(chain, batch[5:9])
    got = chain.float()
    assert ((got - expected).norm() / expected.norm()).item() < 2e-2


def test_the_layer_is_batch_invariant_under_the_triton_backend(monkeypatch):
    """MultiHeadLatentAttention's absorbed form under the Triton backend in the mode (the kernel, and the
    per-head products W_UK^T q and W_UV a head by head through ``project``): a token decoded alone gives
    the bits it gets inside a verify chain and inside a batch with another sequence."""
    from outpace.attention.context import forward_settings

    monkeypatch.setattr(mla_kernels, "invariant_split_rows", 32)
    layer = absorbed_layer()
    g = torch.Generator().manual_seed(12)
    lengths = [70, 40]
    tables = [list(range(0, 14)), list(range(20, 28))]  # 5-row blocks
    x = [torch.randn(n, 24, generator=g).to(DEVICE) for n in lengths]  # [length, hidden] each
    layer.bind_cache(28, 5, torch.float32, DEVICE)

    def forward(calls, backend="triton"):
        meta = build_paged_metadata(
            [tables[s] for s, _, _ in calls],
            [c for _, c, _ in calls],
            [q for _, _, q in calls],
            5,
            DEVICE,
        )
        rows = torch.cat([x[s][c : c + q] for s, c, q in calls])
        positions = torch.cat([torch.arange(c, c + q) for _, c, q in calls]).to(DEVICE)
        with torch.no_grad(), forward_context(meta, get_backend(backend)):
            return layer(positions, rows)

    with forward_settings(True):
        # the caches' rows (rewritten with the same bits below), which the layer writes before attending:
        # the same under either backend, so the torch one's (the kernel over a 110-token prefill is slow here)
        forward([(0, 0, 70), (1, 0, 40)], "torch")
        chain = forward([(0, 60, 4)])
        alone = [forward([(0, 60 + i, 1)]) for i in range(4)]
        batch = forward([(1, 30, 3), (0, 60, 4)])
    for i in range(4):
        assert torch.equal(alone[i], chain[i : i + 1])
    assert torch.equal(chain, batch[3:7])


# Batch-invariant mode under a tree mask -------------------------------------------------------------------------------

# Draft trees as parent lists in the engine's order (parents first, node 0 the root: the last accepted token):
# depth 2 .. 4 (nodes on the longest path), verify widths 3 .. 8.
TREES = {
    "depth2": [-1, 0, 0],
    "depth3": [-1, 0, 0, 1, 2, 1],
    "depth4_odd": [-1, 0, 0, 1, 3, 2, 2],
    "depth4_wide": [-1, 0, 1, 2, 0, 1, 4, 0],
}


def tree_paths(parents: list[int]) -> list[list[int]]:
    """Each node's path from the root: its ancestors by depth, then itself."""
    paths = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else []) + [node])
    return paths


class DraftTree:
    """A committed prefix and a draft tree over one latent cache, with a query per node: the tree verified as
    one sequence (the nodes at rows prefix .. prefix + width - 1 in the engine's order), and for each node
    the sequence that verifying its path as a chain, or decoding it after its ancestors are committed,
    holds (the prefix, then the path's rows). A companion sequence of ``companion`` rows widens the block
    table."""

    def __init__(
        self, parents, prefix, companion, block_size, heads, rank, rope, g, dtype=torch.float32
    ):
        self.paths = tree_paths(parents)
        self.prefix, self.block_size = prefix, block_size
        rows = lambda n: torch.randn(n, rank + rope, generator=g)  # noqa: E731
        prefix_rows, node_rows = rows(prefix), rows(len(parents))
        sequences = [torch.cat((prefix_rows, node_rows)), rows(companion)]
        sequences += [torch.cat((prefix_rows, node_rows[path])) for path in self.paths]
        needed = [-(-len(s) // block_size) for s in sequences]
        blocks = torch.randperm(sum(needed) + 3, generator=g)[: sum(needed)].tolist()
        starts = torch.tensor([0] + needed).cumsum(0).tolist()
        self.tables = [blocks[a:b] for a, b in zip(starts, starts[1:])]
        cache = torch.randn(sum(needed) + 3, block_size, rank + rope, generator=g)
        for table, seq in zip(self.tables, sequences):
            padded = torch.cat((seq, torch.zeros(-len(seq) % block_size, rank + rope)))
            cache[table] = padded.view(len(table), block_size, rank + rope)
        self.cache = cache[:, :, None].to(DEVICE, dtype)  # [num_blocks, block_size, 1, rank + rope]
        self.node_q = torch.randn(len(parents), heads, rank + rope, generator=g).to(DEVICE, dtype)
        self.companion_q = torch.randn(companion, heads, rank + rope, generator=g).to(DEVICE, dtype)
        self.mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
        for node, path in enumerate(self.paths):
            self.mask[node, path] = True
        self.rank = rank

    def tree_call(self):
        """The tree verified beside the companion's decode step and the last node's chain (causal rows in a
        masked batch): rows [companion, nodes..., the chain's nodes...]."""
        companion, last = self.companion_q.shape[0], len(self.paths) - 1
        calls, chain_q = self.chain_call(last)
        return (
            [(1, companion - 1, 1, None), (0, self.prefix, len(self.paths), self.mask.to(DEVICE))]
            + calls,
            torch.cat((self.companion_q[-1:], self.node_q, chain_q)),
        )

    def chain_call(self, node):
        """The node's path verified as a chain (its last row the node)."""
        path = self.paths[node]
        return [(2 + node, self.prefix, len(path), None)], self.node_q[path]

    def alone_call(self, node):
        """The node decoded alone after its ancestors were committed."""
        path = self.paths[node]
        return [(2 + node, self.prefix + len(path) - 1, 1, None)], self.node_q[node : node + 1]

    def attend(self, call, scale, up=None):
        """(sequence, cached rows, new tokens, mask or None) per sequence, the queries [num_tokens, heads,
        rank + rope] -> (the kernel's attended latents, or with ``up`` their projections; the torch
        reference of the attended latents, in float32)."""
        calls, q = call
        masks = [m for _, _, _, m in calls]
        meta = build_paged_metadata(
            [self.tables[s] for s, _, _, _ in calls],
            [c for _, c, _, _ in calls],
            [n for _, _, n, _ in calls],
            self.block_size,
            DEVICE,
            masks if any(m is not None for m in masks) else None,
        )
        q_latent, q_rope = q[..., : self.rank], q[..., self.rank :]
        expected = torch_reference(
            q_latent.float(), q_rope.float(), self.cache.float(), meta, scale
        )
        if up is None:
            return mla_paged_attention(q_latent, q_rope, self.cache, meta, scale), expected
        parts = torch.stack((q_latent * 0.5, q_latent * 0.5))  # [2, n, heads, rank]
        return mla_attention_up(parts, q_rope, self.cache, meta, scale, up), expected


# (tree, committed prefix, heads, W_UV): every tree; each pair of short or long prefix, 16 heads or 3 / 5, with
# or without W_UV. Prefix 30: the window across the 32-row split boundary, the depth-3 nodes' logical rows
# too; 125: the window from a block boundary across 128 (a split and a merge group of 4 splits), the depth-4
# node's logical rows too, that last split neutral for the other nodes; 250: 8 splits up to the window's end
# (2 merge groups, 3 beside the companion's 10 splits).
TREE_CASES = [
    ("depth3", 30, 16, False),
    ("depth2", 250, 16, True),
    ("depth4_wide", 7, 3, True),
    ("depth4_odd", 125, 5, False),
]


@pytest.mark.parametrize("tree, prefix, heads, with_up", TREE_CASES)
def test_batch_invariant_tree_nodes_equal_their_chain_and_their_decode(
    tree, prefix, heads, with_up, monkeypatch
):
    """Under the mode a tree node's row runs over its logical rows (the prefix, then its ancestors, then
    itself), so it gets the bits of the same token verified in its path's chain and decoded alone after its
    ancestors are committed: at odd trees of depth 2 .. 4 and widths 3 .. 8, over short and long prefixes
    in a 300-row table (32-row splits: up to 10), at 16 heads (one node a tile) and at 3 or 5 (a tile
    spanning nodes of several branches), with and without W_UV in the merge; close to the torch path."""
    from outpace.attention.context import forward_settings

    monkeypatch.setattr(mla_kernels, "invariant_split_rows", 32)
    g = torch.Generator().manual_seed(prefix * heads + len(TREES[tree]))
    rank, rope = 36, 8
    draft = DraftTree(TREES[tree], prefix, 300, 5, heads, rank, rope, g)
    up = torch.randn(heads, 7, rank, generator=g).to(DEVICE) if with_up else None

    def project(attended):
        return attended if up is None else torch.einsum("thr,hvr->thv", attended, up)

    with forward_settings(True):
        tree_out, expected = draft.attend(draft.tree_call(), 0.3, up)
        torch.testing.assert_close(tree_out, project(expected), rtol=1e-5, atol=1e-5)
        width = len(draft.paths)
        nodes = tree_out[
            1 : 1 + width
        ]  # (row 0: the companion's decode step; then the last node's chain)
        for node in range(width):
            chain, _ = draft.attend(draft.chain_call(node), 0.3, up)
            alone, _ = draft.attend(draft.alone_call(node), 0.3, up)
            assert torch.equal(nodes[node], chain[-1]), f"node {node} against its chain"
            assert torch.equal(nodes[node], alone[0]), f"node {node} against its decode"
        assert torch.equal(
            tree_out[1 + width :], chain
        )  # the last node's chain, in the masked batch


@pytest.mark.parametrize("layout, heads", [("tree", 6), ("ragged_tree", 3)])
def test_batch_invariant_tree_masks_equal_the_torch_path(layout, heads, monkeypatch):
    """The mode's logical-row walk under the layouts' tree masks: windows wider than the new tokens (cached
    speculative rows), a sequence shorter than the window (its first mask columns before row 0) and causal
    sequences in a masked batch, equal to the torch path."""
    from outpace.attention.context import forward_settings

    monkeypatch.setattr(mla_kernels, "invariant_split_rows", 32)
    g = torch.Generator().manual_seed(heads)
    rank, rope = 36, 8
    meta, num_blocks = make_meta(layout, 5, g)
    n = meta.slot_mapping.shape[0]
    cache = torch.randn(num_blocks, 5, 1, rank + rope, generator=g).to(DEVICE)
    q_latent = torch.randn(n, heads, rank, generator=g).to(DEVICE)
    q_rope = torch.randn(n, heads, rope, generator=g).to(DEVICE)
    expected = torch_reference(q_latent, q_rope, cache, meta, 0.3)
    with forward_settings(True):
        got = mla_paged_attention(q_latent, q_rope, cache, meta, 0.3)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu  # bf16 at the DeepSeek-V2-Lite shape: GPU only
@pytest.mark.parametrize("with_up", [False, True])
def test_bf16_batch_invariant_tree_nodes_at_the_v2_lite_shape(with_up):
    """The tree invariance test in bf16 at DeepSeek-V2-Lite's shape (16 heads, 512 + 64, W_UV's 128 rows) with
    the mode's own 512-row splits: a width-8 tree after 1020 committed rows (its window across a split
    boundary) in a 1500-row table; each node bit-identical to its chain and its decode, close to float32."""
    from outpace.attention.context import forward_settings

    g = torch.Generator().manual_seed(6)
    draft = DraftTree(TREES["depth4_wide"], 1020, 1500, 16, 16, 512, 64, g, torch.bfloat16)
    up = torch.randn(16, 128, 512, generator=g).to(DEVICE, torch.bfloat16) if with_up else None
    with forward_settings(True):
        tree_out, expected = draft.attend(draft.tree_call(), 192**-0.5, up)
        for node in range(len(draft.paths)):
            chain, _ = draft.attend(draft.chain_call(node), 192**-0.5, up)
            alone, _ = draft.attend(draft.alone_call(node), 192**-0.5, up)
            assert torch.equal(tree_out[1 + node], chain[-1])
            assert torch.equal(tree_out[1 + node], alone[0])
    if up is None:
        got = tree_out.float()
        assert ((got - expected).norm() / expected.norm()).item() < 2e-2
