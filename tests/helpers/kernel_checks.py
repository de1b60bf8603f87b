"""What the fused-kernel tests share: seeded random tensors on the test's device and the relative error of a
result against its reference (the ``poisoned`` fixture, NaN-filled output buffers, is tests/conftest.py's)."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape, seed: int, dtype=torch.float32, device=DEVICE) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (same shape and dtype asserted)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()
