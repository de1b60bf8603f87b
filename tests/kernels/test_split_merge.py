"""Split-KV's merge by each query tile's last split (attention/split_merge.py, ``merge_splits_in_kernel``)
against the combine launch it replaces and against the torch backend: decode, chain verify of widths 2..8,
tree masks, ragged batches with empty splits and tiles past a sequence's new tokens, GQA 1 and 4, odd head
dims and block sizes, output gates (one logit a head, one an element), a sliding window and an FP8 cache.
Every buffer the kernels allocate is poisoned, so a row the merge forgets shows up; the tickets are zero
again after every launch, so a second launch (the next layer, the next replay) merges as the first did.
Without CUDA the kernels run in Triton's interpreter (conftest.py), one program after another: the last
program to take a tile's ticket is its last split that runs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.attention_cases import Case, make_case, poisoned_allocations
from outpace.attention import split_merge
from outpace.attention.kv_quant import FP8_KV_DTYPE, quantize
from outpace.attention.torch_backend import TorchAttentionBackend
from outpace.attention.triton_kernels import paged_attention, write_kv

# (cached rows, new tokens, tree window or None) per sequence
LAYOUTS = {
    "decode": ([37, 5, 130, 0], [1, 1, 1, 1], None),
    "verify2": ([20, 45], [2, 2], None),
    "verify8": ([70, 9, 33], [8, 8, 8], None),
    "tree": ([30, 12, 50], [5, 8, 3], [9, 8, 7]),
    "ragged": ([0, 17, 64, 9], [40, 25, 1, 4], None),
}


def attend(case: Case, merge: bool, num_splits: int, **kwargs) -> torch.Tensor:
    """The Triton kernels' output over fresh copies of the caches, the splits merged in the kernel or by the
    combine; the tickets checked zero afterwards."""
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(split_merge, "merge_splits_in_kernel", merge)
        with poisoned_allocations():
            table = write_kv(case.k, case.v, k_cache, v_cache, case.meta, kwargs.get("kv_scales"))
            out = paged_attention(
                case.q,
                k_cache,
                v_cache,
                case.meta,
                table,
                case.scale,
                num_splits=num_splits,
                **kwargs,
            )
    if merge:
        assert not split_merge.merge_tickets(case.q.device).any()  # reset for the next launch
    return out


def assert_merges_as_the_combine(case: Case, num_splits: int, **kwargs) -> torch.Tensor:
    merged = attend(case, True, num_splits, **kwargs)
    combined = attend(case, False, num_splits, **kwargs)
    assert merged.shape == combined.shape and not merged.isnan().any()
    torch.testing.assert_close(merged, combined, atol=2e-6, rtol=1e-5)
    return merged


@pytest.mark.parametrize("num_splits", [2, 5, 16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_merges_as_the_combine_and_the_torch_backend(layout, num_splits):
    """More splits than some sequences have KV tiles (empty splits, which take no ticket), GQA 4."""
    seed = list(LAYOUTS).index(layout) * 7 + num_splits
    case = make_case(*LAYOUTS[layout], heads=8, kv_heads=2, seed=seed)
    merged = assert_merges_as_the_combine(case, num_splits)
    caches = (case.k_cache.clone(), case.v_cache.clone())
    expected = TorchAttentionBackend().forward(
        case.q, case.k, case.v, caches, case.meta, case.scale
    )
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "shape", [(3, 12, 4, 4), (6, 20, 6, 2)], ids=["bs3-d12-mha", "bs6-d20-gqa3"]
)
def test_odd_shapes(shape):
    block_size, head_dim, heads, kv_heads = shape
    case = make_case(
        *LAYOUTS["tree"],
        block_size=block_size,
        head_dim=head_dim,
        heads=heads,
        kv_heads=kv_heads,
        seed=3,
    )
    assert_merges_as_the_combine(case, 4)


@pytest.mark.parametrize("kind", ["head", "element"])
def test_output_gate_stored_by_the_merge(kind):
    """Without the combine the merging program stores the gated output (Step-3.5's gate a head, Qwen3-Next's an
    element), from a strided view of a wider projection as the fused kernels leave it."""
    case = make_case(*LAYOUTS["verify8"], seed=11)
    num_tokens, heads, head_dim = case.q.shape
    g = torch.Generator().manual_seed(5)
    if kind == "head":
        gate = (4 * torch.randn(num_tokens, 2 * heads, generator=g))[:, heads:]
    else:
        gate = (4 * torch.randn(num_tokens, heads, 2, head_dim, generator=g))[:, :, 1]
    gate = gate.to(case.q.device)
    gated = assert_merges_as_the_combine(case, 3, out_gate=gate)
    plain = attend(case, True, 3)
    per_element = gate if gate.dim() == 3 else gate[..., None]
    torch.testing.assert_close(gated, plain * torch.sigmoid(per_element), atol=1e-6, rtol=1e-5)


def test_sliding_window():
    """Tiles whose first splits start past the window's edge (kv_start > 0)."""
    case = make_case(*LAYOUTS["verify8"], seed=13)
    m = case.meta
    positions = (m.seq_lens - m.query_lens)[m.token_seq_index] + m.token_query_index
    assert_merges_as_the_combine(case, 4, sliding_window=24, positions=positions)


def test_fp8_cache():
    """The v scale applied to each split's accumulator before the merge, as before the combine."""
    case = make_case(*LAYOUTS["decode"], seed=17)
    scales = tuple(torch.tensor(s, device=case.q.device) for s in (0.05, 0.03))
    fp8 = Case(
        case.q,
        case.k,
        case.v,
        quantize(case.k_cache, scales[0], FP8_KV_DTYPE),
        quantize(case.v_cache, scales[1], FP8_KV_DTYPE),
        case.meta,
        case.scale,
    )
    assert_merges_as_the_combine(fp8, 5, kv_scales=scales)
