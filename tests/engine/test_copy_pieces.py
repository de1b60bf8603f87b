"""engine/copy_pieces_kernel.py: many copies in one launch (a step run ahead saving its rows' request state,
engine/run_ahead.py), in Triton's interpreter on the CPU (on the GPU too): pieces of several dtypes, sizes
across the block boundary and row slices of buffers, copied exactly and nothing else written; a piece that
is not whole 32-bit words refused (the caller keeps torch's copies)."""

import pytest
import torch

pytest.importorskip("triton")

from outpace.engine.copy_pieces_kernel import BLOCK, CopyPieces  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_every_piece_is_copied_in_one_launch():
    g = torch.Generator().manual_seed(0)
    states = torch.randn(5, 3, BLOCK + 7, generator=g).to(DEVICE)  # rows of more than one block
    conv = torch.randn(5, 6, 10, generator=g).to(DEVICE, torch.bfloat16)  # 120 bytes a row
    lengths = torch.randint(0, 99, (5,), generator=g).to(DEVICE)  # int64
    sources = [states[1:3], states[4:5], conv[1:3], conv[4:5], lengths[1:3], lengths[4:5]]
    targets = [torch.full_like(t, -1) for t in sources]
    guard = torch.full((3,), -1.0, device=DEVICE)  # (another tensor: untouched)
    copies = CopyPieces.of(targets, sources)
    words = [t.numel() * t.element_size() // 4 for t in sources]
    assert (
        copies.blocks == sum(-(-w // BLOCK) for w in words) == 15
    )  # (a program a block of a piece)
    copies()
    for target, source in zip(targets, sources):
        assert torch.equal(target, source)
    assert torch.equal(guard, torch.full((3,), -1.0, device=DEVICE))
    states.add_(1.0)  # the plan copies the same regions again, whatever they hold now
    copies()
    assert torch.equal(targets[0], states[1:3])


def test_pieces_that_are_not_whole_words_are_left_to_the_caller():
    odd = torch.zeros(3, dtype=torch.bfloat16, device=DEVICE)  # 6 bytes
    assert not CopyPieces.takes(odd.clone(), odd)
    assert not CopyPieces.takes(torch.zeros(4, device=DEVICE), torch.zeros(5, device=DEVICE))
    assert not CopyPieces.takes(
        torch.zeros(3, 2, device=DEVICE).t(), torch.zeros(2, 3, device=DEVICE)
    )
    assert CopyPieces.of([], []) is None
    with pytest.raises(ValueError, match="whole, aligned 32-bit words"):
        CopyPieces.of([odd.clone()], [odd])
