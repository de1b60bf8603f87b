"""Which projections of a built model the checkpoint stores quantized, and their replacement by
``QuantizedLinear`` before the weights load (models/loader.py calls ``quantize_modules``).

A module is quantized when the checkpoint has its format's scale beside its weight (``weight_scale_inv`` for
block FP8, ``weight_scale`` beside an fp8 ``weight`` for ModelOpt, ``weight_packed`` + ``weight_scale`` for
INT4): read per module, so DeepSeek-V3's MTP layer (layers.61: FP8 decoder weights, bf16 ``eh_proj``, norms
and ``shared_head``), routers, ``e_score_correction_bias``, embeddings, heads and norms and Qwen's
linear-attention ``A_log``/``conv1d``/``dt_bias``/``in_proj_a/b`` each load as the checkpoint stores them.
The config's list of unquantized modules (``modules_to_not_convert`` / ``ignore`` / ``exclude_modules``) is
the cross-check: a module the checkpoint quantizes that the list excludes is refused, and so is a quantized
tensor without its scale (an fp8 ``weight`` or a ``weight_packed`` alone) or a scale beside a module that
outpace cannot hold quantized; each error names the tensor and its file. Packed expert stacks (a
``RoutedExperts``' ``gate_up_proj``) are held quantized where transformers' fused FP8 experts' scale is stored
beside them, in per-tensor FP8 (``_quantize_packed``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from outpace.checkpoint import CheckpointError, checkpoint_files, open_shard, skips_tensor
from outpace.layers.quant.experts import (
    PACKED_ACTIVATION_SCALE,
    PACKED_SCALE,
    QuantizedStackedWeight,
    has_packed_stacks,
    quantize_packed_stacks,
)
from outpace.layers.quant.linear import (
    FORMATS,
    SCALE_DTYPES,
    Fp8Block,
    Fp8Tensor,
    Int4Group,
    QuantizedLinear,
    quantized_like,
)
from outpace.layers.quant.scheme import (
    INT4_GROUP,
    MODELOPT_CONFIG_FILE,
    QuantScheme,
    per_tensor_names,
)
from outpace.validation import ConfigError

# safetensors' dtype names (its header) -> torch dtypes, for the tensors this module looks at
_STORED_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I32": torch.int32,
}


# a checkpoint tensor as its file's header gives it: (stored dtype, file, shape)
Stored = tuple[torch.dtype | str, Path, tuple[int, ...]]


def stored_tensors(model_dir: str | Path) -> dict[str, Stored]:
    """Every checkpoint tensor's (stored dtype, file, shape), from the headers (no tensor is read)."""
    found: dict[str, Stored] = {}
    for path in checkpoint_files(model_dir):
        with open_shard(path) as f:
            for name in f.keys():
                if path.suffix == ".bin":
                    tensor = f.get_tensor(name)
                    found[name] = (tensor.dtype, path, tuple(tensor.shape))
                else:
                    part = f.get_slice(name)
                    dtype = part.get_dtype()
                    found[name] = (_STORED_DTYPES.get(dtype, dtype), path, tuple(part.get_shape()))
    return found


def quantize_modules(
    model: nn.Module,
    scheme: QuantScheme,
    model_dir: str | Path,
    device: str | torch.device | None = None,
) -> int:
    """Replace every projection the checkpoint stores quantized by a ``QuantizedLinear`` (module docstring)
    on ``device`` (default: the projection's); returns how many. Raises ConfigError or CheckpointError
    naming the module, tensor and file."""
    tensors = stored_tensors(model_dir)
    scheme = per_tensor_names(
        scheme, set(tensors)
    )  # (per-tensor FP8: its scales' names, as stored)
    fmt = FORMATS[scheme.method](scheme)
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    _refuse_unmatched_excludes(model, scheme, tensors, to_ckpt)
    replaced: dict[int, QuantizedLinear] = {}
    quantized_prefixes: set[str] = set()
    from outpace.layers.moe import StackedWeight  # (layers/moe.py imports this package)

    for name, module in list(model.named_modules(remove_duplicate=False)):
        if _quantize_packed(module, name, fmt, tensors, to_ckpt, replaced, device):
            quantized_prefixes.add(to_ckpt(f"{name}.down_proj").removesuffix(".down_proj"))
            continue
        stacked = isinstance(module, StackedWeight)
        if not (isinstance(module, nn.Linear) or stacked) or not name:
            continue
        prefix = to_ckpt(f"{name}.weight").removesuffix(".weight")
        scale_key = f"{prefix}.{fmt.scale_name}"
        scale, weight_key = tensors.get(scale_key), f"{prefix}.{fmt.weight_name}"
        if scale is None or weight_key not in tensors:
            continue
        if scheme.excludes(prefix):
            raise ConfigError(
                f"{scale[1]}: tensor {scale_key!r} quantizes module {prefix!r}, which "
                f"{scheme.exclude_field} keeps unquantized"
            )
        if stacked and not isinstance(fmt, Fp8Block):
            raise CheckpointError(
                f"{scale[1].name}: tensor {scale_key!r} quantizes the stacked experts "
                f"{prefix!r} in {scheme.description}: only block-FP8 stacks are implemented "
                "(Step-3.5-Flash-FP8's layout)"
            )
        if isinstance(fmt, Int4Group) and f"{prefix}.weight_shape" not in tensors:
            raise CheckpointError(
                f"{tensors[weight_key][1]}: tensor {weight_key!r} has no {prefix}.weight_shape beside it "
                f"(compressed-tensors writes one beside every packed weight: {scheme.description}, "
                f"{scheme.source})"
            )
        if id(module) not in replaced:
            _check_scale_dtype(scale_key, scale)
            if stacked:
                layer = QuantizedStackedWeight(module, fmt, scale[0], prefix, device)
            else:  # (a per-tensor scale stored [1] rather than []: ModelOpt writes either)
                one = isinstance(fmt, Fp8Tensor) and scale[2] == (1,)
                layer = quantized_like(module, fmt, scale[0], prefix, device, (1,) if one else None)
                _input_scale_as_stored(layer, prefix, tensors)
            _check_scale_shape(
                layer, layer.weight_scale_inv if stacked else layer.scale, scale_key, scale
            )
            replaced[id(module)] = layer
        quantized_prefixes.add(prefix)
    _replace_everywhere(model, replaced)
    skipped = skips_tensor(model)
    unread = {n: t for n, t in tensors.items() if not skipped(n)}
    _refuse_unclaimed(unread, quantized_prefixes | held_elsewhere(model, to_ckpt), scheme)
    return len(replaced)


def _refuse_unmatched_excludes(
    model: nn.Module, scheme: QuantScheme, tensors: dict[str, Stored], to_ckpt: Callable[[str], str]
) -> None:
    """Refuse module names of the config's list of unquantized modules that name no module (a misspelt name,
    another model's), naming the file, the field and the names. The modules: the model's, by its names and by the
    checkpoint's (a tied head too, which the checkpoint does not store), and every one the checkpoint stores
    tensors under (the vision towers and MTP layers outpace skips too); the match, ``QuantScheme.unmatched_excludes``.
    vLLM (compressed_tensors.py should_ignore_layer, fp8.py is_layer_skipped) and compressed-tensors
    (utils/match.py match_named_modules, since its pull 431; before, lifecycle/apply.py warned) let such a name
    pass."""
    if not scheme.exclude:
        return
    modules: set[str] = set()
    for name, _ in model.named_modules():
        if name:
            modules |= {name, to_ckpt(f"{name}.weight").removesuffix(".weight")}
    for tensor in tensors:
        parts = tensor.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts)))
    unmatched = scheme.unmatched_excludes(modules)
    if unmatched:
        raise ConfigError(
            f"{scheme.exclude_field} lists {list(unmatched)}, which name no module of the model nor of its "
            "checkpoint's tensors"
        )


def _input_scale_as_stored(layer: QuantizedLinear, prefix: str, tensors: dict[str, Stored]) -> None:
    """A static activation scale stored [1] rather than [] (per-tensor FP8 writes either) held so."""
    name = getattr(layer.format, "input_scale_name", None)
    stored = tensors.get(f"{prefix}.{name}") if name else None
    if stored is not None and stored[2] == (1,):
        layer.register_buffer(name, getattr(layer, name).new_ones(1))


def _check_scale_dtype(key: str, scale: Stored) -> None:
    """A scale stored in a dtype no scale parameter takes (float64, an integer, fp8) is refused before its
    layer is made, naming the tensor and its file."""
    dtype, path, _ = scale
    if dtype not in SCALE_DTYPES:
        named = str(dtype).removeprefix("torch.")
        allowed = ", ".join(str(d).removeprefix("torch.") for d in SCALE_DTYPES)
        raise CheckpointError(
            f"{path}: tensor {key!r} has dtype {named}, a quantization scale must be one of {allowed}"
        )


def _full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The checkpoint shape of a parameter that may hold this rank's part of it (its ``shard``)."""
    shape, shard = list(param.shape), getattr(param, "shard", None)
    if shard is not None:
        shape[shard.dim] = shard.full
    return tuple(shape)


def _check_scale_shape(layer: nn.Module, param: torch.Tensor, key: str, scale: Stored) -> None:
    """The stored scale's shape against the one the layer's format gives its projection, refused before any
    tensor is read naming the tensor, its file and the config field whose block or group size sets it (an
    INT4 projection whose columns are not whole groups, too)."""
    scheme = layer.format.scheme
    if isinstance(layer, QuantizedLinear):
        out_features, in_features = layer.out_features, layer.in_features
        shard = getattr(layer.stored_weight, "shard", None)
        if shard is not None and shard.dim == 0:
            out_features = shard.full
        elif shard is not None:
            in_features = shard.full * layer.format.weight_column_factor()
        whole = f"[{out_features}, {in_features}] projection"
    else:  # (a stack of experts)
        experts, out_features, in_features = _full_shape(layer.weight)
        whole = f"[{experts}, {out_features}, {in_features}] stack of expert projections"
    if scheme.group is not None and in_features % scheme.group:
        raise CheckpointError(
            f"{scale[1]}: tensor {key!r} scales a {whole} whose {in_features} columns are not whole "
            f"{_layout(scheme)}: not implemented"
        )
    expected = _full_shape(param)
    if scale[2] != expected:
        raise CheckpointError(
            f"{scale[1]}: tensor {key!r} has shape {scale[2]}, the model expects {expected}: the scales "
            f"of its {whole} in {_layout(scheme)}"
        )


def _layout(scheme: QuantScheme) -> str:
    """Where a format's scale layout comes from, for errors: the config field and its file."""
    if scheme.group is not None:
        what, field = f"groups of {scheme.group}", "config_groups.*.weights.group_size"
    elif scheme.block is not None:
        what = f"blocks of {list(scheme.block)}"
        field = "weight_block_size"
        if scheme.producer == "compressed-tensors":
            field = "config_groups.*.weights.block_structure"
    else:
        return f"{scheme.description}, {scheme.source}"
    return f"{what} (quantization_config.{field} in {scheme.source})"


def _quantize_packed(
    module: nn.Module,
    name: str,
    fmt,
    tensors: dict[str, Stored],
    to_ckpt: Callable[[str], str],
    done: dict[int, nn.Module],
    device: str | torch.device | None,
) -> bool:
    """Whether ``module`` holds packed expert stacks (a ``RoutedExperts``' ``gate_up_proj`` parameter) that the
    checkpoint stores quantized, as transformers' fused FP8 experts (a ``gate_up_proj_scale_inv`` beside them):
    then made to hold them so (layers/quant/experts.py ``quantize_packed_stacks``), in per-tensor FP8 only (any
    other format refused naming the tensor and its file); marked in ``done`` once."""
    if not name or not has_packed_stacks(module):
        return False
    prefix = to_ckpt(f"{name}.down_proj").removesuffix(".down_proj")
    scale = tensors.get(f"{prefix}.gate_up_proj{PACKED_SCALE}")
    if scale is None:
        return False
    if not isinstance(fmt, Fp8Tensor):
        raise CheckpointError(
            f"{scale[1].name}: tensor {prefix}.gate_up_proj{PACKED_SCALE!s} quantizes the fused expert "
            f"stacks {prefix!r} in {fmt.scheme.description}: only per-tensor FP8 ones are implemented"
        )
    if id(module) not in done:
        stored = {}
        for p in ("gate_up_proj", "down_proj"):
            for suffix in (PACKED_SCALE, PACKED_ACTIVATION_SCALE):
                key = f"{prefix}.{p}{suffix}"
                if key not in tensors:
                    continue
                dtype, path, shape = tensors[key]
                _check_scale_dtype(key, tensors[key])
                if not shape or any(n != 1 for n in shape[1:]):  # (one scale an expert)
                    raise CheckpointError(
                        f"{path}: tensor {key!r} has shape {shape}, a per-tensor FP8 stack of experts "
                        "has one scale an expert: [experts] or [experts, 1, 1]"
                    )
                stored[f"{p}{suffix}"] = (dtype, shape)
        quantize_packed_stacks(module, fmt, stored, device)
        done[id(module)] = module
    return True


def _replace_everywhere(model: nn.Module, replaced: dict[int, nn.Module]) -> None:
    """Put each replacement (by the id of the module it replaces) under every name that module has: a module
    held twice (Nemotron-H's MTP stack and its draft step share ``eh_proj``: models/drafts/nemotron_h_mtp.py)
    has only one name that is a checkpoint's, and its other name must not keep the unquantized module."""
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if id(module) in replaced:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, replaced[id(module)])


def held_elsewhere(model: nn.Module, to_ckpt: Callable[[str], str]) -> set[str]:
    """The checkpoint prefixes of the modules other ranks hold (expert parallelism: layers/moe.py
    ``RoutedExperts.checkpoint_tensors_elsewhere``, the other ranks' experts): their quantized tensors are
    theirs, skipped unread here (checkpoint.py), not unclaimed."""
    return {
        to_ckpt(f"{prefix}.{name}" if prefix else name).rpartition(".")[0]
        for prefix, module in model.named_modules()
        for name in getattr(module, "checkpoint_tensors_elsewhere", list)()
    }


def _refuse_unclaimed(tensors: dict[str, Stored], quantized: set[str], scheme: QuantScheme) -> None:
    """A quantized tensor whose module was not made quantized: its scale is missing, or outpace has no
    quantized form of the module (e.g. stacked expert tensors), or it belongs to another format. ``tensors``:
    those the loader reads (not a multimodal checkpoint's skipped towers: ``ignored_checkpoint_tensors``)."""
    fmt = FORMATS[scheme.method](scheme)
    for name, (dtype, path, _) in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix in quantized:
            continue
        if leaf in (fmt.weight_name, "weight_packed") and (
            dtype == torch.float8_e4m3fn or leaf == "weight_packed"
        ):
            raise CheckpointError(
                f"{path.name}: tensor {name!r} is stored quantized ({dtype}) but has no "
                f"{prefix}.{fmt.scale_name} beside it (a {scheme.description} checkpoint, "
                f"{scheme.source})"
            )
        if (
            dtype == torch.float8_e4m3fn
        ):  # e.g. transformers' fused FP8 experts (gate_up_proj, down_proj)
            raise CheckpointError(
                f"{path.name}: tensor {name!r} is stored in {dtype}, a form of it outpace does not read "
                f"(not a projection's {fmt.weight_name!r} nor a stack of experts it implements)"
            )
        if leaf == fmt.scale_name:
            raise CheckpointError(
                f"{path.name}: tensor {name!r} is the scale of a quantized {prefix!r}, which outpace "
                "cannot hold quantized (not a projection of the model nor a stack of its experts)"
            )


def check_loaded(model: nn.Module, model_dir: str | Path | None = None) -> None:
    """After loading: compressed-tensors' ``weight_shape`` of every INT4 projection is its [out, in]
    (this rank's part under tensor parallelism: the checkpoint gives the whole); the error names the
    tensor and, given ``model_dir``, its file."""
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    for name, module in model.named_modules():
        shape = getattr(module, "weight_shape", None)
        if not isinstance(module, QuantizedLinear) or shape is None:
            continue
        whole = [module.out_features, module.in_features]
        weight = module.stored_weight
        shard = getattr(weight, "shard", None)
        if shard is not None:
            whole[shard.dim] = shard.full * (
                module.format.weight_column_factor() if shard.dim else 1
            )
        if shape.tolist() != whole:
            key = to_ckpt(f"{name}.weight_shape")
            where = ""
            if model_dir is not None:
                where = f"{stored_tensors(model_dir).get(key, (None, model_dir))[1]}: "
            raise CheckpointError(
                f"{where}tensor {key!r} is {shape.tolist()}, the model's projection is {whole} "
                "(compressed-tensors' weight_shape: the unpacked [out, in])"
            )


def quantized_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of the quantized projections' tensors as stored, bytes of every parameter and buffer)."""
    quantized = sum(
        t.numel() * t.element_size()
        for m in model.modules()
        if isinstance(m, (QuantizedLinear, QuantizedStackedWeight))
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
    )
    seen, total = set(), 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return quantized, total


# ---- load_format="dummy": quantized layers without a checkpoint (benchmarks of quantized shapes) ----

# projections the published quantized checkpoints keep in high precision whatever their config lists: the
# head, DeepSeek MTP's eh_proj and shared head (DeepSeek-V3's files: bf16), Qwen3-Next's shared expert gate
# (vLLM's qwen3_next.py builds it, as the router, with quant_config=None), Step-3.5's head-wise attention
# gate g_proj (one row per head, 64 or 96: less than one 128-row block, and at TP = 2 a rank's 32 or 48 rows
# would cut one, which vLLM's block-FP8 linear refuses, yet vLLM serves Step-3.5-Flash-FP8 at TP = 2 to 8)
_NEVER_QUANTIZED = ("lm_head", "eh_proj", "shared_head", "shared_expert_gate", "g_proj")
# the scales' dtype as published: DeepSeek-V3's weight_scale_inv float32, Kimi-K2-Thinking's INT4
# weight_scale bf16 (layers/quant/linear.py Int4Group)
_DUMMY_SCALE_DTYPES = {INT4_GROUP: torch.bfloat16}


def quantize_dummy_modules(
    model: nn.Module, scheme: QuantScheme, device: str | torch.device | None = None
) -> int:
    """For ``load_format="dummy"``: replace every projection a published checkpoint of ``scheme`` stores
    quantized by a ``QuantizedLinear``, without a checkpoint: every ``nn.Linear`` but the head, MTP's
    ``eh_proj`` and shared head and what the config's list keeps unquantized (and, INT4, a projection whose
    columns are not whole groups), on ``device`` (default: the projection's); and, block FP8, every stack of
    routed experts (layers/moe.py ``StackedWeight``) by a ``QuantizedStackedWeight``, as
    Step-3.5-Flash-FP8 stores its ``moe.{gate,up,down}_proj`` (another format's stacks are refused, as
    ``quantize_modules`` refuses them). Returns how many. Their tensors are filled by
    ``fill_dummy_quantized``."""
    from outpace.layers.moe import StackedWeight  # (layers/moe.py imports this package)

    fmt = FORMATS[scheme.method](scheme)
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    replaced: dict[int, nn.Module] = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if name and has_packed_stacks(module):
            raise ConfigError(
                f"{_config_field(scheme)}: {scheme.description} for the fused expert stacks "
                f"{to_ckpt(name)!r}: a dummy load does not quantize them (a checkpoint's per-tensor FP8 "
                "stacks load: layers/quant/experts.py quantize_packed_stacks)"
            )
        stacked = isinstance(module, StackedWeight)
        if not (isinstance(module, nn.Linear) or stacked) or not name:
            continue
        prefix = to_ckpt(f"{name}.weight").removesuffix(".weight")
        parts = prefix.split(".")
        if any(p in parts for p in _NEVER_QUANTIZED) or scheme.excludes(prefix):
            continue
        if stacked and not isinstance(fmt, Fp8Block):
            raise ConfigError(
                f"{_config_field(scheme)}: {scheme.description} for the stacked experts {prefix!r}: only "
                "block-FP8 stacks are implemented (Step-3.5-Flash-FP8's layout)"
            )
        if scheme.group is not None and module.in_features % scheme.group:
            continue
        if id(module) not in replaced:
            scale_dtype = _DUMMY_SCALE_DTYPES.get(scheme.method, torch.float32)
            make = QuantizedStackedWeight if stacked else quantized_like
            replaced[id(module)] = make(module, fmt, scale_dtype, prefix, device)
    _replace_everywhere(model, replaced)
    return len(replaced)


def _config_field(scheme: QuantScheme) -> str:
    """Where ``scheme`` was read, for errors: config.json's ``quantization_config`` field, or ModelOpt's
    hf_quant_config.json."""
    if Path(scheme.source).name == MODELOPT_CONFIG_FILE:
        return scheme.source
    return f"{scheme.source}: field 'quantization_config'"


def fill_dummy_quantized(
    layer: QuantizedLinear | QuantizedStackedWeight, std: float = 0.02
) -> None:
    """Random stored values and scales of about ``std`` (the dummy load's normal(0, 0.02) weights), made on
    the layer's device: fp8 values of normal(0, 1) with scales ``std``; INT4 words of random nibbles
    (uniform in [-8, 7], standard deviation about 4.6) with scales ``std`` / 4.6."""
    with torch.no_grad():
        if isinstance(layer, QuantizedStackedWeight):  # (block FP8, no bias)
            layer.weight.copy_(torch.randn(layer.weight.shape, device=layer.weight.device))
            layer.weight_scale_inv.fill_(std)
            return
        weight, scale = layer.stored_weight, layer.scale
        if weight.dtype == torch.int32:
            bits = torch.randint(-(2**31), 2**31 - 1, weight.shape, device=weight.device)
            weight.copy_(bits.to(torch.int32))
            scale.fill_(std / 4.6)
        else:
            weight.copy_(torch.randn(weight.shape, device=weight.device).to(weight.dtype))
            scale.fill_(std)
        if layer.bias is not None:
            layer.bias.zero_()
