"""layers/argmax.py: the argmax by pieces is torch's argmax to the index, ties and NaN included."""

import pytest
import torch

from outpace.layers.argmax import argmax_in_pieces, argmax_last


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pieces_give_the_first_index_of_the_maximum(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (3, 5, 1024), generator=g).to(dtype)  # many ties, across pieces too
    x[0, 0] = 2.0
    x[0, 0, 700] = x[0, 0, 70] = 9.0  # the maximum in two pieces: the earlier wins
    x[1, 2, 513] = float("nan")  # a NaN is the maximum
    x[1, 3, 5] = x[1, 3, 900] = float("nan")
    x[2, 4] = float("-inf")
    for chunks in (2, 16, 64):
        assert torch.equal(argmax_in_pieces(x, chunks), x.argmax(-1)), chunks


def test_cpu_and_narrow_rows_take_torch_s_argmax():
    x = torch.randn(4, 300)
    assert torch.equal(argmax_last(x), x.argmax(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_vocabulary_widths():
    g = torch.Generator(device="cuda").manual_seed(1)
    for width in (102400, 151936, 128256, 262144, 32000):
        x = torch.randn(7, width, device="cuda", generator=g).to(torch.bfloat16)
        x[3, width // 3] = x[3, width - 1] = 50.0
        assert torch.equal(argmax_last(x), x.argmax(-1)), width
