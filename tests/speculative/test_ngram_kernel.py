"""speculative/drafters/ngram_kernel.py (in Triton's interpreter on a CPU, on the GPU where there is one): the n-gram
history write in one launch equals the drafter's torch update, for verify widths below, at and above the
drafter's window, with strided tokens and bonus."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from outpace.speculative.drafters.ngram_kernel import write_history  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU: the interpreter


@pytest.mark.parametrize("out_width", [1, 3, 5, 7])
def test_write_history_equals_the_torch_update(out_width):
    g = torch.Generator().manual_seed(out_width)
    width, b, max_len = 5, 6, 40
    history = torch.randint(0, 1000, (b + 3, max_len), generator=g)
    req_indices = torch.randperm(b + 3, generator=g)[:b]
    lengths = torch.randint(0, max_len - width - 1, (b,), generator=g)
    wide = torch.randint(0, 1000, (b, out_width + 1), generator=g)
    tokens = wide[:, 1:]  # strided
    accepted = torch.randint(0, out_width, (b,), generator=g)
    tokens[torch.arange(out_width) > accepted[:, None]] = -1  # -1 after the bonus
    bonus = wide[:, 0]  # strided

    want = history.clone()
    pos = lengths[:, None] + 1 + torch.arange(width)
    out = F.pad(tokens, (0, width - out_width), value=-1)
    want[req_indices[:, None], pos] = torch.where(out >= 0, out, bonus[:, None])

    got = history.to(DEVICE)
    args = (t.to(DEVICE) for t in (req_indices, lengths, tokens, bonus))
    write_history(got, *args, width)
    assert torch.equal(got.cpu(), want)
