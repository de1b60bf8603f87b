"""The recurrent states' commit in one launch (cache/state_commit_kernel.py; Triton's interpreter here, compiled on
a GPU) against the gather and index_copy per tensor it replaces: state tensors of several dtypes and row sizes
(float32 delta-rule states, bf16 convolution windows, an odd row of 32-bit words), requests committing
different snapshot rows, rows owned by no request left as they were."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.cache.state_commit_kernel import StateCommit  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, else the interpreter
SLOTS, VERIFY_ROWS = 6, 5
SHAPES = [
    ((3, 40, 7), torch.float32),
    ((10, 6), torch.bfloat16),
    ((2, 2100), torch.float32),
    ((5,), torch.int32),
]


def tensors(g: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    states, snapshots = [], []
    for shape, dtype in SHAPES:
        for rows, out in ((SLOTS,), states), ((SLOTS, VERIFY_ROWS), snapshots):
            values = torch.randn(*rows, *shape, generator=g) * 100
            out.append(values.to(dtype).to(DEVICE))
    return states, snapshots


def test_one_launch_commits_what_a_gather_and_copy_per_tensor_commits():
    states, snapshots = tensors(torch.Generator().manual_seed(0))
    expected = [s.clone() for s in states]
    indices = torch.tensor([4, 0, 2], device=DEVICE)
    rows = torch.tensor([3, 0, 4], device=DEVICE)
    for state, snaps in zip(expected, snapshots):
        state.index_copy_(0, indices, snaps[indices, rows])
    untouched = [s[[1, 3, 5]].clone() for s in states]
    StateCommit(states, snapshots)(indices, rows)
    for got, want, kept in zip(states, expected, untouched):
        assert torch.equal(got, want)
        assert torch.equal(got[[1, 3, 5]], kept)


def test_rows_of_bytes_not_in_words_are_refused():
    states = [torch.zeros(SLOTS, 3, dtype=torch.bfloat16, device=DEVICE)]
    snapshots = [torch.zeros(SLOTS, VERIFY_ROWS, 3, dtype=torch.bfloat16, device=DEVICE)]
    with pytest.raises(ValueError, match="6 bytes"):
        StateCommit(states, snapshots)
