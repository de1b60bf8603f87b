"""An FP8 KV cache's per-layer scales (attention/kv_quant.py), from the checkpoint where it has them.

Checkpoint names, each a float32 scalar ([] or [1]), under the prefix of the attention block that holds
the projections (``model.layers.N.self_attn``):
- ModelOpt FP8 (NVIDIA's ``hf_quant_config.json``): ``k_proj.k_scale`` and ``v_proj.v_scale``; vLLM's
  ``maybe_remap_kv_scale_name`` (vllm/model_executor/model_loader/weight_utils.py) maps
  ``.self_attn.k_proj.k_scale`` to its ``.self_attn.attn.k_scale``;
- compressed-tensors / llm-compressor: ``k_scale`` and ``v_scale`` on the block itself (vLLM maps
  ``.k_scale`` to ``.attn.k_scale``), or already under ``attn.``;
- the deprecated ``kv_scale``: one scale for both (vLLM loads it as k_scale and copies it to v_scale);
- MLA (DeepSeek): the latent cache's one scale as ``kv_a_proj_with_mqa.k_scale`` or ``k_proj.k_scale``
  (SGLang's ``maybe_remap_deepseek_mla_kv_scale``), or ``k_scale``; a ``v_scale`` beside it is unused (the
  row is key and value: vLLM's MLA writes it with ``_k_scale`` alone).

A layer's candidates are looked up under its own module name and its parent's (``Attention`` sits at
``self_attn.attn``, MLA is ``self_attn``), through the model's ``checkpoint_name`` map (MTP layers). A
layer the checkpoint gives no scale keeps 1.0, and the engine warns, naming how many and the first.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from outpace.attention.layer import PagedCacheLayer
from outpace.checkpoint import CheckpointError, checkpoint_files, open_shard

logger = logging.getLogger("outpace.cache")

# a scale buffer's name -> the checkpoint suffixes that give it, under a block's prefix, first found wins
_SUFFIXES = {
    "k_scale": (
        "k_proj.k_scale",
        "kv_a_proj_with_mqa.k_scale",
        "k_scale",
        "attn.k_scale",
        "kv_scale",
    ),
    "v_scale": ("v_proj.v_scale", "v_scale", "attn.v_scale", "kv_scale"),
}


def kv_scale_candidates(model: nn.Module) -> dict[str, list[str]]:
    """Each scale buffer of the model's cache layers (``model.layers.0.self_attn.attn.k_scale``) -> the
    checkpoint names that may hold it, in order of preference."""
    to_ckpt = getattr(model, "checkpoint_name", lambda name: name)
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, PagedCacheLayer):
            continue
        prefixes = [to_ckpt(name)] + ([to_ckpt(name.rpartition(".")[0])] if "." in name else [])
        for scale in module.kv_scale_names:
            found[f"{name}.{scale}"] = [f"{p}.{s}" for p in prefixes for s in _SUFFIXES[scale]]
    return found


def load_kv_scales(model: nn.Module, model_dir: str | Path | None) -> int:
    """Copy the checkpoint's k/v scales into the cache layers of ``model`` (None: no checkpoint, random
    weights); returns how many were found. Those not found stay 1.0, with a warning."""
    candidates = kv_scale_candidates(model)
    wanted = {c for names in candidates.values() for c in names}
    values: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(model_dir) if model_dir is not None else []:
        with open_shard(path) as f:
            for name in wanted.intersection(f.keys()):
                values[name] = _scale_value(f.get_tensor(name), name, path)
    buffers = dict(model.named_buffers())
    missing = []
    for buffer, names in candidates.items():
        name = next((n for n in names if n in values), None)
        if name is None:
            missing.append(buffer)
            continue
        with torch.no_grad():
            buffers[buffer].fill_(values[name])
    if missing:
        logger.warning(
            "FP8 KV cache: %s has no k/v scale for %d of %d cache scales (first: %s, looked up as %s): "
            "they are 1.0, so cached values beyond +-448 are clamped",
            model_dir or "the model (random weights)",
            len(missing),
            len(candidates),
            missing[0],
            ", ".join(candidates[missing[0]]),
        )
    return len(candidates) - len(missing)


def _scale_value(tensor: torch.Tensor, name: str, path: Path) -> float:
    """A checkpoint scale as a float: one finite, positive value."""
    value = tensor.float().flatten()
    if value.numel() != 1 or not bool(value.isfinite().all()) or float(value) <= 0:
        raise CheckpointError(
            f"{path}: KV cache scale {name!r} must be one finite positive value, got "
            f"{tuple(tensor.shape)} {value[:4].tolist()}"
        )
    return float(value)
