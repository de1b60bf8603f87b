"""speculative/proposer.py ``PendingRows.take_verified``: the one-launch kernel (speculative/pending_window_kernel.py,
in Triton's interpreter on a CPU, on the GPU where there is one) writes what the torch form writes, bit for bit:
windows with held rows, rows near position 0, verifies of every depth, a padding row."""

from types import SimpleNamespace

import pytest
import torch

from outpace.speculative.proposer import PendingRows, Verified
from outpace.speculative.verify import VerifyResult

pytest.importorskip("triton")

from outpace.layers.zeroed_scratch import _BUFFERS  # noqa: E402
from outpace.speculative.pending_window_kernel import take_verified  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _windows(indices: int, width: int, hidden: int, g: torch.Generator) -> PendingRows:
    pending = PendingRows(indices, width, hidden, torch.bfloat16, torch.device("cpu"))
    pending.hidden.copy_(torch.randn(pending.hidden.shape, generator=g))
    pending.tokens.copy_(torch.randint(0, 1000, pending.tokens.shape, generator=g))
    pending.start.copy_(torch.randint(0, 50, (indices,), generator=g))
    pending.count.copy_(torch.randint(1, width + 1, (indices,), generator=g))  # held rows too
    return pending


def _verified(
    req_indices, lengths, accepted, depth: int, hidden: int, g
) -> tuple[Verified, torch.Tensor]:
    """A chain verify of ``depth`` drafts: row s accepted ``accepted[s]``; its states [b * (depth + 1), hidden]."""
    b, width = len(req_indices), depth + 1
    a = torch.tensor(accepted)
    steps = torch.arange(width).expand(b, width)
    path = torch.where(steps <= a[:, None], steps, -1)
    tokens = torch.randint(0, 1000, (b, width), generator=g)
    out = torch.where(steps <= a[:, None], tokens, -1)
    result = VerifyResult(
        output_token_ids=out,
        num_correct_drafts=a,
        bonus_token_ids=out.gather(1, a[:, None])[:, 0],
        last_correct_step_indices=a,
        accepted_path=path,
    )
    rows = SimpleNamespace(
        req_indices=torch.tensor(req_indices), lengths=torch.tensor(lengths), size=b
    )
    state = torch.randn(b * width, hidden, generator=g).to(torch.bfloat16)
    return Verified(rows, state, None, result), state


def _on(device: str, pending: PendingRows) -> list[torch.Tensor]:
    return [t.clone().to(device) for t in pending.tensors()]


@pytest.mark.parametrize(
    "keep, depth, rows, width, hidden",
    [
        (1, 2, 3, 12, 96),
        (0, 3, 4, 12, 300),
        (2, 1, 3, 13, 257),
        (1, 0, 3, 12, 64),
        (3, 4, 5, 17, 40),
    ],
)
def test_the_kernel_writes_what_the_torch_form_writes(keep, depth, rows, width, hidden):
    g = torch.Generator().manual_seed(keep * 100 + depth * 10 + width)
    pending = _windows(7, width, hidden, g)
    req_indices = [4, 0, 2, 6, 5]  # index 6: the padding row, length 0
    lengths = [
        9,
        1,
        0 if keep else 3,
        0,
        40,
    ]  # a row at position 1 keeps at most one; a fresh one none
    accepted = [min(depth, k) for k in (depth, 0, 1, 0, depth)]
    verified, state = _verified(req_indices, lengths, accepted, depth, hidden, g)
    expected = PendingRows(7, width, hidden, torch.bfloat16, torch.device("cpu"))
    for mine, theirs in zip(expected.tensors(), pending.tensors()):
        mine.copy_(theirs)
    expected.take_verified(verified, state, keep, rows)  # the torch form (CPU tensors)

    got = _on(DEVICE, pending)
    r, res = verified.rows, verified.result
    take_verified(
        *got,
        *(t.to(DEVICE) for t in (r.req_indices, r.lengths, res.num_correct_drafts)),
        res.bonus_token_ids.to(DEVICE),
        res.accepted_path.to(DEVICE),
        res.output_token_ids.to(DEVICE),
        state.to(DEVICE),
        keep,
        rows,
    )
    for name, want, have in zip(("hidden", "tokens", "start", "count"), expected.tensors(), got):
        assert torch.equal(want, have.cpu()), name
    counters = [b for (owner, *_), b in _BUFFERS.items() if "take_verified" in owner]
    assert counters and not any(b.any() for b in counters)  # left zero for the next launch
    # the rows it kept: the last of the old window's, in order
    old_count = pending.count[4].item()
    kept = min(old_count, keep, 9)
    assert torch.equal(expected.hidden[4, :kept], pending.hidden[4, old_count - kept : old_count])
    assert (
        expected.count[4].item() == kept + accepted[0] + 1 and expected.start[4].item() == 9 - kept
    )


@pytest.mark.parametrize(
    "width, narrow, hidden, drafts",
    [
        (12, None, 96, 2),
        (13, None, 300, 1),
        (4, None, 64, 3),
        (12, None, 64, 0),
        (12, 4, 96, 2),
        (12, 3, 64, 0),
    ],
)
def test_a_draft_s_window_and_layer_tokens_are_the_torch_form_s(width, narrow, hidden, drafts):
    """The gathered windows (states, tokens, start, count, positions, last rows) and each MTP layer's tokens
    (after 0 .. ``drafts`` drafts; none: a zero-draft step that runs its layers) from the kernels equal the torch
    form's, for windows with held rows and one pending row; and a narrow window (no row pending past its columns)
    holds the pending rows of the whole window."""
    from outpace.speculative import pending_window_kernel as kernels

    g = torch.Generator().manual_seed(width + hidden + drafts)
    pending = _windows(7, width, hidden, g)
    pending.count[3] = 1
    if narrow is not None:  # no request's row pending past it; the padding row's count may be more
        pending.narrow = narrow
        pending.count.clamp_(max=narrow)
        pending.count[6] = width
    req_indices = torch.tensor([4, 0, 3, 6])
    want = pending.window(req_indices, narrow is not None)  # the torch form (CPU tensors)
    columns = pending.columns(narrow is not None)
    got = kernels.window(*_on(DEVICE, pending), req_indices.to(DEVICE), columns)
    for name, a, b in zip(want._fields, want, got):
        assert torch.equal(a, b.cpu()), name
    assert bool((want.last < 4 * columns).all())
    whole = pending.window(req_indices[:3])  # the requests' rows (the last: the padding row)
    live, narrow_live = whole.live, want.live[: 3 * columns]
    assert torch.equal(narrow_live, live.view(3, width)[:, :columns].reshape(-1))
    assert torch.equal(want.count[:3], whole.count)
    assert torch.equal(want.hidden[: 3 * columns][narrow_live], whole.hidden[live])
    assert torch.equal(want.positions[: 3 * columns][narrow_live], whole.positions[live])
    assert torch.equal(whole.last // width * columns + whole.last % width, want.last[:3])
    made = [torch.randint(0, 1000, (4,), generator=g) for _ in range(drafts)]
    for k in range(1, 4):
        for d in range(drafts + 1):
            expected = PendingRows.layer_tokens(want, made[:d], k)
            stacked = torch.stack(made[:d], 1) if d else torch.empty(4, 0, dtype=torch.int64)
            tokens = kernels.layer_tokens(
                want.tokens.to(DEVICE), want.count.to(DEVICE), stacked.to(DEVICE), k
            )
            assert torch.equal(expected, tokens.cpu()), (k, d)


@pytest.mark.parametrize("width, hidden", [(12, 96), (13, 300), (4, 2500)])
def test_a_held_row_is_appended_as_the_torch_form_appends_it(width, hidden):
    """``PendingRows.append`` by the kernel (one program a row, walking its states in blocks: 2500 takes three)
    equals the torch form for windows that hold one row, several, and all but one of their columns."""
    from outpace.speculative.pending_window_kernel import append

    g = torch.Generator().manual_seed(width * hidden)
    pending = _windows(7, width, hidden, g)
    pending.count[4], pending.count[0], pending.count[2] = 1, width - 1, 3
    req_indices = torch.tensor([4, 0, 2, 6])  # index 6: the padding row, once
    state = torch.randn(4, hidden, generator=g).to(torch.bfloat16)
    after = torch.randint(0, 1000, (4,), generator=g)
    got = _on(DEVICE, pending)
    pending.append(req_indices, state, after)  # the torch form (CPU tensors)
    append(got[0], got[1], got[3], req_indices.to(DEVICE), state.to(DEVICE), after.to(DEVICE))
    for name, want, have in zip(("hidden", "tokens", "start", "count"), pending.tensors(), got):
        assert torch.equal(want, have.cpu()), name
    assert torch.equal(pending.hidden[0, width - 1], state[1]) and pending.count[0] == width
