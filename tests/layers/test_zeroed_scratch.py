"""layers/zeroed_scratch.py: one buffer of zeros per owner, device, size and dtype, made by the first call and
returned by every later one (captured graphs hold its address); made inside a CUDA graph capture, refused by
name (GPU only)."""

import pytest
import torch

from outpace.layers.zeroed_scratch import zeroed_scratch


def test_one_buffer_per_owner_device_size_and_dtype():
    cpu = torch.device("cpu")
    first = zeroed_scratch("test: counters", cpu, 5, torch.int32)
    assert first.shape == (5,) and first.dtype == torch.int32 and not first.any()
    first[2] = 7  # (a launch that did not reset it: the next call gets the same buffer, as it is)
    again = zeroed_scratch("test: counters", cpu, 5, torch.int32)
    assert again.data_ptr() == first.data_ptr() and again[2] == 7
    others = [
        zeroed_scratch("test: tickets", cpu, 5, torch.int32),
        zeroed_scratch("test: counters", cpu, 6, torch.int32),
        zeroed_scratch("test: counters", cpu, 5, torch.int64),
    ]
    assert len({t.data_ptr() for t in [first, *others]}) == 4
    assert not any(t.any() for t in others)


@pytest.mark.gpu
def test_a_buffer_first_asked_for_inside_a_capture_is_refused_by_owner():
    graph, device = torch.cuda.CUDAGraph(), torch.device("cuda", torch.cuda.current_device())
    with pytest.raises(RuntimeError, match="test: refused counters"):
        with torch.cuda.graph(graph):
            zeroed_scratch("test: refused counters", device, 3, torch.int32)
