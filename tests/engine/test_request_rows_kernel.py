"""engine/request_rows_kernel.py (in Triton's interpreter on a CPU): the decode step's one-launch gather of its
rows equals the torch gathers it replaces, at a table wider than one program's block and with repeated rows."""

import pytest
import torch

pytest.importorskip("triton")

from outpace.engine.request_rows_kernel import BLOCK, gather_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU: the interpreter


def test_gather_rows_equals_torch_s_gathers():
    g = torch.Generator().manual_seed(0)
    rows, width = 7, BLOCK + 37  # the last block of columns cut short
    lengths, last_tokens, seeds = (torch.randint(0, 2**40, (rows,), generator=g) for _ in range(3))
    wide = torch.randint(0, 1000, (rows, width + 5), generator=g)
    tables = wide[:, :width]  # a row stride past the width
    lengths, last_tokens, seeds, tables = (
        t.to(DEVICE) for t in (lengths, last_tokens, seeds, tables)
    )
    indices = torch.tensor(
        [3, 0, 6, 6, 1], device=DEVICE
    )  # the padding row (6) twice, as a padded batch has it
    got = gather_rows(indices, lengths, last_tokens, seeds, tables)
    want = (tables[indices], lengths[indices], last_tokens[indices], seeds[indices])
    for a, b in zip(got, want):
        assert torch.equal(a, b)
