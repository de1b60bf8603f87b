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


def test_requests_at_the_held_row_are_not_copied():
    """A chain's verify left the state after its last node in the rows (cache/recurrent_states.py): requests that
    commit that node keep their rows as they are, the others take their snapshot rows; the torch form, the same."""
    from outpace.cache.recurrent_states import RecurrentStates
    from outpace.layers.recurrent import RecurrentMetadata

    states, snapshots = tensors(torch.Generator().manual_seed(1))
    indices = torch.tensor([4, 0, 2], device=DEVICE)
    rows = torch.tensor([3, 0, 3], device=DEVICE)
    expected = [s.clone() for s in states]
    for state, snaps in zip(expected, snapshots):
        state[0] = snaps[0, 0]  # request 0 commits row 0; requests 4 and 2 hold row 3
    torch_form = [s.clone() for s in states]
    StateCommit(states, snapshots)(indices, rows, 3)
    for got, want in zip(states, expected):
        assert torch.equal(got, want)
    pool = RecurrentStates.__new__(RecurrentStates)  # the torch form over the same tensors
    pool._states, pool._snapshots, pool._commit_kernel = torch_form, snapshots, None
    pool.commit(indices, rows, RecurrentMetadata(indices, indices >= 0, snapshots=True, last_row=3))
    for got, want in zip(torch_form, expected):
        assert torch.equal(got, want)
