"""Which attention backend a device gets (attention/registry.py ``resolve_backend_name``)."""

import pytest

from outpace.attention.registry import resolve_backend_name


def test_auto_takes_torch_off_cuda():
    assert resolve_backend_name("auto", "cpu") == "torch"


def test_triton_off_cuda_is_refused_by_name_outside_the_interpreter(monkeypatch):
    """It was taken, and the first request failed inside Triton ("0 active drivers"), found by fuzzing the
    loader; Triton's interpreter (the CPU tests) runs its kernels on the CPU."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend_name("triton", "cpu") == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="attention_backend='triton' is invalid on device 'cpu'"):
        resolve_backend_name("triton", "cpu")
    assert resolve_backend_name("triton", "cuda:0") == "triton"
