"""outpace/host_copies.py: host values arrive on the device with the dtype asked for (lists, host tensors, empty);
on a GPU too, where the copy is queued without a wait."""

import pytest
import torch

from outpace.host_copies import pieces_to_device, pinned, to_device

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_values_arrive_with_the_dtype_asked_for(device):
    cases = [
        ([3, -1, 7], torch.int64, None),
        ([0.5, 2.0], torch.float32, None),
        ([True, False, True], torch.bool, None),
        ([], torch.int64, None),
        (torch.tensor([1, 2, 3], dtype=torch.int64), torch.int32, None),
        ([[1, 2], [3, 4]], torch.int64, (2, 2)),
    ]
    for values, dtype, shape in cases:
        got = to_device(values, device, dtype)
        want = (
            values.to(dtype)
            if isinstance(values, torch.Tensor)
            else torch.tensor(values, dtype=dtype)
        )
        assert got.device.type == device and got.dtype == dtype
        assert shape is None or tuple(got.shape) == shape
        assert torch.equal(got.cpu(), want)


def test_pinned_stays_pageable_for_a_cpu():
    host = pinned([1, 2], torch.device("cpu"))
    assert host.dtype == torch.int64 and not host.is_pinned()


@pytest.mark.parametrize("device", DEVICES)
def test_pieces_arrive_in_their_shapes_each_on_a_16_byte_boundary(device):
    pieces = [
        torch.arange(5),
        torch.arange(6).view(2, 3) * 10,
        torch.tensor([7], dtype=torch.int32),
        torch.zeros(0, dtype=torch.int64),
        torch.tensor([-4, 9]),
    ]
    got = pieces_to_device(pieces, device)
    for piece, view in zip(pieces, got):
        assert view.device.type == device and view.dtype == torch.int64
        assert view.shape == piece.shape and torch.equal(view.cpu(), piece.to(torch.int64))
        assert view.data_ptr() % 16 == 0 or view.numel() == 0
