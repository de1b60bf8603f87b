"""Build a model from a Hugging Face directory: config, class from the registry, weights."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from outpace.checkpoint import DTYPES, load_checkpoint
from outpace.config import ModelConfig
from outpace.models.llama import pack_projections
from outpace.registry import model_class


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def resolve_dtype(requested: str, cfg: ModelConfig, device: str) -> torch.dtype:
    """'auto' keeps the checkpoint's dtype on GPU and uses float32 on CPU."""
    if requested != "auto":
        return DTYPES[requested]
    return DTYPES[cfg.torch_dtype] if device.startswith("cuda") else torch.float32


def build_model(cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device = "cpu") -> nn.Module:
    """An uninitialised model (parameters in ``dtype``; rotary tables stay float32)."""
    with default_dtype(dtype), torch.device(device):
        return model_class(cfg.architecture)(cfg)


def load_model(model_dir: str | Path, dtype: torch.dtype, device: str = "cpu", progress: bool = True,
               load_format: str = "safetensors") -> nn.Module:
    """``load_format`` "dummy" skips the weights and fills the parameters with small random values
    (vLLM's ``--load-format dummy``): for benchmarks of a shape without its checkpoint."""
    cfg = ModelConfig.from_pretrained(model_dir)
    model = build_model(cfg, dtype, device)
    if load_format == "dummy":
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0 if "norm" in name else 0.0)
    else:
        load_checkpoint(model, model_dir, progress=progress)
    pack_projections(model)
    model.checkpoint_dir = Path(model_dir)
    return model.eval()
