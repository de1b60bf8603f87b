"""outpace/host_repeat.py: each value its count times, as torch's repeat_interleave gives them (lists and host
tensors, zero counts, nothing at all)."""

import torch

from outpace.host_repeat import repeat_counts, run_positions


def test_values_repeated_as_torch_repeats_them():
    cases = [
        ([4, 9, 2], [3, 1, 2]),
        (range(5), [0, 2, 0, 1, 4]),
        (torch.tensor([7, -3]), torch.tensor([2, 5])),
        ([], []),
    ]
    for values, counts in cases:
        want = torch.tensor(list(values), dtype=torch.int64).repeat_interleave(
            torch.as_tensor(counts, dtype=torch.int64)
        )
        got = repeat_counts(values, counts)
        assert got.dtype == torch.int64 and got.device.type == "cpu"
        assert torch.equal(got, want), (values, counts)


def test_run_positions_count_each_run_from_zero():
    assert run_positions([3, 0, 2, 1]).tolist() == [0, 1, 2, 0, 1, 0]
    assert run_positions(torch.tensor([2, 2])).tolist() == [0, 1, 0, 1]
    assert run_positions([]).tolist() == []
    assert run_positions([3, 0, 2], [10, 4, -1]).tolist() == [10, 11, 12, -1, 0]
    assert run_positions(torch.tensor([1, 2]), torch.tensor([5, 7])).tolist() == [5, 7, 8]
