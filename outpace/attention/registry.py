"""Attention backends by name, imported lazily."""

from __future__ import annotations

import importlib
import importlib.util
import os

from outpace.attention.backend import AttentionBackend

_BACKENDS = {
    "torch": "outpace.attention.torch_backend:TorchAttentionBackend",
    "triton": "outpace.attention.triton_backend:TritonAttentionBackend",
}
_instances: dict[str, AttentionBackend] = {}


def triton_available() -> bool:
    """Whether Triton can be imported: CUDA builds of torch bring it, CPU-only installs need not."""
    return importlib.util.find_spec("triton") is not None


def resolve_backend_name(requested: str, device: str) -> str:
    """'auto' -> triton on CUDA when Triton is installed, torch otherwise. An explicit 'triton' without
    Triton installed is refused here, naming the way out, not at the first forward."""
    if requested == "auto":
        return "triton" if device.startswith("cuda") and triton_available() else "torch"
    if requested == "triton" and not triton_available():
        raise ValueError(
            "attention_backend='triton' needs the triton package, which is not installed "
            "(pip install triton, or use attention_backend 'torch')"
        )
    if (
        requested == "triton"
        and not device.startswith("cuda")
        and os.environ.get("TRITON_INTERPRET") != "1"
    ):
        raise ValueError(
            f"attention_backend='triton' is invalid on device {device!r}: its kernels run on CUDA (or in "
            "Triton's interpreter, TRITON_INTERPRET=1); use attention_backend 'torch'"
        )
    return requested


def get_backend(name: str) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(
            f"attention backend {name!r} is unknown: must be one of {', '.join(_BACKENDS)}"
        )
    if name not in _instances:
        module, cls = _BACKENDS[name].split(":")
        _instances[name] = getattr(importlib.import_module(module), cls)()
    return _instances[name]
