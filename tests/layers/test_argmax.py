"""layers/argmax.py and argmax_kernel.py: the two-launch argmax is torch's argmax to the index, ties and NaN included (in Triton's
interpreter on a CPU)."""

import pytest
import torch

from outpace.layers.argmax import argmax_last

pytest.importorskip("triton")

from outpace.layers.argmax_kernel import PIECE, argmax_rows  # noqa: E402

# argmax_rows itself: in the interpreter on a CPU, on the GPU where there is one
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pieces_give_the_first_index_of_the_maximum(dtype):
    width = 3 * PIECE + 77  # a last piece cut short
    g = torch.Generator().manual_seed(0)
    x = (
        torch.randint(-3, 4, (8, width), generator=g).to(dtype).to(DEVICE)
    )  # many ties, across pieces too
    x[0] = 2.0
    x[0, 2 * PIECE + 5] = x[0, 70] = 9.0  # the maximum in two pieces: the earlier wins
    x[1, PIECE + 513] = float("nan")  # a NaN is the maximum
    x[2, 5] = x[2, 3 * PIECE + 10] = float("nan")  # the first NaN wins
    x[3] = float("-inf")  # every column -inf: index 0
    x[4, :PIECE] = float("-inf")  # a whole piece -inf
    x[5, width - 1] = 100.0  # the last column of the short piece
    x[6, PIECE - 1] = x[6, PIECE] = 50.0  # a tie across a piece boundary
    assert torch.equal(argmax_rows(x), x.argmax(-1))


def test_strided_rows_and_leading_dims():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 2 * PIECE + 1, generator=g).to(DEVICE)
    assert torch.equal(argmax_rows(x.view(-1, x.shape[-1])), x.argmax(-1).view(-1))
    wide = torch.randn(4, 3 * PIECE, generator=g).to(DEVICE)[
        :, : 2 * PIECE + 9
    ]  # row stride past the width
    assert torch.equal(argmax_rows(wide), wide.argmax(-1))


def test_cpu_and_narrow_rows_take_torch_s_argmax():
    x = torch.randn(4, 300)
    assert torch.equal(argmax_last(x), x.argmax(-1))


@pytest.mark.gpu  # needs a GPU
def test_gpu_vocabulary_widths():
    g = torch.Generator(device="cuda").manual_seed(1)
    for width in (102400, 151936, 128256, 262144, 32000, 8192):
        x = torch.randn(7, 3, width, device="cuda", generator=g).to(torch.bfloat16)
        x[3, 1, width // 3] = x[3, 1, width - 1] = 50.0
        x[5, 2, width // 2] = float("nan")
        assert torch.equal(argmax_last(x), x.argmax(-1)), width
