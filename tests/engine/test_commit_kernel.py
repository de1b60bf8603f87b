"""engine/commit_kernel.py (in Triton's interpreter on a CPU, on the GPU where there is one): a decode step's end
in one launch gives the table and the packed outputs that RequestTable.commit's torch path gives, with padded
rows, strided inputs (a plain step's bonus is a column of the argmax) and more rows than one program takes."""

import pytest
import torch

pytest.importorskip("triton")

from outpace.engine.commit_kernel import ROWS, commit_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU: the interpreter


@pytest.mark.parametrize("width", [1, 3, 6])
def test_commit_rows_equals_the_torch_updates(width):
    g = torch.Generator().manual_seed(width)
    table_rows = ROWS + 20
    pad = table_rows - 1
    real = torch.randperm(pad, generator=g)[: ROWS + 5]  # distinct rows, more than one program's
    indices = torch.cat([real, torch.full((4,), pad)])  # then four padded rows
    b = indices.shape[0]
    lengths = torch.randint(0, 1000, (b,), generator=g)
    wide = torch.randint(0, 50000, (b, width + 2), generator=g)
    tokens = wide[:, 1 : width + 1]  # strided
    num_correct = torch.randint(0, width, (2 * b,), generator=g)[::2]  # strided
    bonus = wide[:, 0]  # strided
    table = (torch.randint(0, 1000, (table_rows,), generator=g) for _ in range(2))
    table_lengths, table_last = table
    want_lengths, want_last = table_lengths.clone(), table_last.clone()
    want_lengths[indices] = lengths + num_correct + 1
    want_last[indices] = bonus
    want_lengths[pad] = 0
    want_packed = torch.cat([tokens.reshape(-1), num_correct])

    got_lengths, got_last = table_lengths.to(DEVICE), table_last.to(DEVICE)
    args = (t.to(DEVICE) for t in (indices, lengths, tokens, num_correct, bonus))
    packed = commit_rows(*args, got_lengths, got_last, pad)
    assert torch.equal(packed.cpu(), want_packed)
    assert torch.equal(got_lengths.cpu(), want_lengths)
    # the padded rows leave the padding row's last token as it was; every real row is the torch path's
    assert torch.equal(got_last.cpu()[:pad], want_last[:pad])
    assert got_last.cpu()[pad] == table_last[pad]
