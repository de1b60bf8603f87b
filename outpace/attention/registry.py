"""Attention backends by name, imported lazily."""
from __future__ import annotations

import importlib

from outpace.attention.backend import AttentionBackend

_BACKENDS = {
    "torch": "outpace.attention.torch_backend:TorchAttentionBackend",
    "triton": "outpace.attention.triton_backend:TritonAttentionBackend",
}
_instances: dict[str, AttentionBackend] = {}


def get_backend(name: str) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown: must be one of {', '.join(_BACKENDS)}")
    if name not in _instances:
        module, cls = _BACKENDS[name].split(":")
        _instances[name] = getattr(importlib.import_module(module), cls)()
    return _instances[name]
