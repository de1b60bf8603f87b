"""What the fused-kernel tests share: seeded random tensors on the test's device, the relative error of a
result against its reference (the ``poisoned`` fixture, NaN-filled output buffers, is tests/conftest.py's), and
a record of a Triton kernel's launches."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape, seed: int, dtype=torch.float32, device=DEVICE) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (same shape and dtype asserted)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def record_launches(
    monkeypatch, module, name: str, launches: list | None = None
) -> list[tuple[str, dict]]:
    """Every launch of ``module.name`` (a Triton kernel, launched as ``kernel[grid](...)``) from now on, as
    (name, its keyword arguments: constants and launch options), in order, into ``launches`` (several kernels'
    in one order) or a new list; the kernel still runs."""
    launches = [] if launches is None else launches
    real = getattr(module, name)

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((name, kwargs))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(module, name, Recording())
    return launches
