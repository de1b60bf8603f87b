"""Build a model from a Hugging Face directory: config, class from the registry, weights."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch
from torch import nn

from outpace.checkpoint import DTYPES, checkpoint_tensor_names, load_checkpoint
from outpace.distributed.group import SINGLE, build_group, building_in
from outpace.layers.decoder import pack_projections
from outpace.layers.quant.experts import QuantizedStackedWeight
from outpace.layers.quant.linear import QuantizedLinear
from outpace.layers.quant.loading import (
    check_loaded,
    fill_dummy_quantized,
    quantize_dummy_modules,
    quantize_modules,
)
from outpace.model_config import ModelConfig
from outpace.models.drafts.mtp import has_own_mtp_heads
from outpace.registry import model_class
from outpace.validation import ConfigError

# ModelOpt's per-tensor KV-cache scales (``*.k_proj.k_scale``, ``*.v_proj.v_scale``): the FP8 KV cache's,
# skipped by name while outpace's KV cache is not FP8 (vLLM modelopt.py ModelOptKVCacheMethod loads them)
QUANTIZED_SKIPPED_TENSORS = (r"\.[kv]_scale$",)


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


def build_model(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    mtp_own_heads: bool = False,
) -> nn.Module:
    """An uninitialised model (parameters in ``dtype``; rotary tables stay float32). ``mtp_own_heads``:
    its MTP layers carry their own embedding and shared head (DeepSeek-V3 layout, models/drafts/mtp.py).
    Inside ``building_in(group)`` (distributed/group.py) with several ranks, this rank's shard of a model
    class that declares ``shards_over_ranks``; other classes are refused by name."""
    cls = model_class(cfg.architecture)
    group = build_group()
    if group.size > 1 and not getattr(cls, "shards_over_ranks", False):
        raise ConfigError(
            f"architecture {cfg.architecture} cannot be sharded over tensor_parallel_size="
            f"{group.size} ranks yet: its model class does not declare shards_over_ranks"
        )
    with default_dtype(dtype), torch.device(device):
        return cls(cfg, mtp_own_heads=mtp_own_heads)


def covering_positions(cfg: ModelConfig, positions: int) -> ModelConfig:
    """``cfg`` with rotary tables for at least ``positions`` positions. A draft's
    ``max_position_embeddings`` is the length it was trained at (2048 in the original EAGLE-3 release,
    yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), not a limit of the target's context it serves: RoPE is
    defined at every position, so its tables are sized to cover the target's context too."""
    return dataclasses.replace(
        cfg, max_position_embeddings=max(cfg.max_position_embeddings, positions)
    )


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: str = "cpu",
    progress: bool = True,
    load_format: str = "safetensors",
    min_positions: int = 0,
) -> nn.Module:
    """``load_format`` "dummy" skips the weights and fills the parameters with small random values
    (vLLM's ``--load-format dummy``): for benchmarks of a shape without its checkpoint. Otherwise an
    unreadable weight file raises ``CheckpointError`` before the model is built, and a weight of the
    wrong dtype or not finite while it loads (checkpoint.py ``load_checkpoint``).
    ``min_positions``: rotary tables cover at least this many positions (a draft serving a target
    with a longer context, see ``covering_positions``)."""
    cfg = covering_positions(ModelConfig.from_pretrained(model_dir), min_positions)
    quantized = cfg.quantization is not None
    if load_format == "dummy":
        # (no tensor names to tell the MTP layers' layout: the family's published one)
        own_heads = cfg.num_nextn_predict_layers > 0 and getattr(
            model_class(cfg.architecture), "mtp_own_heads", False
        )
        with parameters_on_meta(quantized):
            model = build_model(cfg, dtype, device, own_heads)
        if quantized:  # (quantized layers with random values: benchmarks of quantized shapes)
            quantize_dummy_modules(model, cfg.quantization, device)
            materialize_parameters(model, device)
        fill_dummy(model)
    else:
        names = checkpoint_tensor_names(
            model_dir
        )  # (every weight file checked readable before the build)
        with parameters_on_meta(quantized):
            model = build_model(cfg, dtype, device, has_own_mtp_heads(cfg, names))
        if quantized:
            quantize_modules(model, cfg.quantization, model_dir, device)
            materialize_parameters(model, device)
            model.ignored_checkpoint_tensors = (
                *getattr(model, "ignored_checkpoint_tensors", ()),
                *QUANTIZED_SKIPPED_TENSORS,
            )
        load_checkpoint(model, model_dir, progress=progress)
        check_loaded(model, model_dir)
    pack_projections(model)
    model.checkpoint_dir = Path(model_dir)
    return model.eval()


def fill_dummy(model: nn.Module) -> None:
    """Small random values in every parameter (``load_format="dummy"``): normal(0, 0.02) matrices, norms
    and scales 1 (a zero scale would make a router's logits all equal: Gemma 4's ``scale`` and
    ``per_expert_scale``, and every token would choose the same experts), other vectors 0; quantized layers
    random stored values and scales of the same size."""
    with torch.no_grad():
        quantized = [
            m for m in model.modules() if isinstance(m, (QuantizedLinear, QuantizedStackedWeight))
        ]
        skip = {id(t) for m in quantized for t in m.parameters(recurse=False)}
        for m in quantized:
            fill_dummy_quantized(m)
        for name, p in model.named_parameters():
            if id(p) not in skip:
                one = "norm" in name or name.endswith("scale")
                p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0 if one else 0.0)


@contextlib.contextmanager
def parameters_on_meta(enabled: bool = True):
    """While building a quantized model: every parameter registered is moved to the meta device (buffers
    stay where they are built, rotary tables computed), so the half-precision projections that are about to
    be replaced by quantized ones never hold memory (a model whose bf16 weights do not fit, e.g.
    Qwen3-Next-80B in FP8 on one 141 GB GPU); ``materialize_parameters`` allocates what remains. Each
    parameter exists on the build device only while its module is made."""
    if not enabled:
        yield
        return
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            moved = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            moved.__dict__.update(param.__dict__)  # (shard marks, checkpoint dtypes)
            param = moved
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def materialize_parameters(model: nn.Module, device: str | torch.device) -> None:
    """Every parameter on the meta device given uninitialised memory on ``device`` (its attributes kept, one
    tensor for a parameter that several modules share: a tied head)."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            if id(param) not in made:
                real = nn.Parameter(
                    torch.empty_like(param, device=device), requires_grad=param.requires_grad
                )
                real.__dict__.update(param.__dict__)
                made[id(param)] = real
            module._parameters[name] = made[id(param)]


def load_part(
    model_dir: str | Path, part: str, dtype: torch.dtype, device: str, buffers_from: nn.Module
) -> nn.Module:
    """The submodule ``part`` (e.g. "mtp_layers") of the model in ``model_dir``, whole (unsharded, whatever
    group is being built) and alone: the rest of the model is built on the meta device (no memory) and its
    checkpoint tensors are never read. Buffers are computed, not stored (rotary tables), and a meta build
    has none: they are copied from ``buffers_from``, the same submodule of the model as loaded (buffers are
    never sharded). Projections stay unpacked (``pack_projections`` is for serving)."""
    cfg = ModelConfig.from_pretrained(model_dir)
    with building_in(SINGLE):
        model = build_model(
            cfg, dtype, "meta", has_own_mtp_heads(cfg, checkpoint_tensor_names(model_dir))
        )
        if cfg.quantization is not None:
            quantize_modules(model, cfg.quantization, model_dir)
    whole = model.get_submodule(part).to_empty(device=device)
    load_checkpoint(model, model_dir, progress=False, part=part)
    source = dict(buffers_from.named_buffers())
    with torch.no_grad():
        for name, buffer in whole.named_buffers():
            found = source.get(name)
            if found is None or found.shape != buffer.shape:
                raise ValueError(
                    f"buffer {part}.{name} of {model_dir} is {tuple(buffer.shape)} in the whole part but "
                    f"{'absent' if found is None else tuple(found.shape)} in the model as loaded"
                )
            buffer.copy_(found)
    return whole
