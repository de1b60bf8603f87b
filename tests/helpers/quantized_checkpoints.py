"""Quantized copies of the tests' random checkpoints, written in the published layouts, each beside its
dequantized twin (the same model with every quantized weight replaced by its float32 dequantization: the
reference the quantized model must equal).

Layouts (layers/quant/scheme.py cites where each fact comes from):
- "fp8_block": ``weight`` float8_e4m3fn + ``weight_scale_inv`` [ceil(N/bn), ceil(K/bk)] (fp32 as DeepSeek's,
  or bf16 as some Qwen ones), config.json ``quantization_config`` {"quant_method": "fp8", "fmt": "e4m3",
  "activation_scheme": "dynamic", "weight_block_size": [bn, bk]};
- "fp8_tensor": ModelOpt, ``weight`` float8_e4m3fn + ``weight_scale`` [] + ``input_scale`` [], and
  ``hf_quant_config.json`` {"producer": ..., "quantization": {"quant_algo": "FP8", ...}};
- "int4_group": compressed-tensors pack-quantized, ``weight_packed`` int32 [N, K/8] + ``weight_scale`` bf16
  [N, K/group] + ``weight_shape`` int32 [2], config.json's ``quantization_config`` with one config group.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from outpace.layers.quant import dequantize as dq


def block_fp8_config(block=(16, 16), **extra) -> dict:
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
        **extra,
    }


def int4_config(group: int = 8, ignore=()) -> dict:
    """Kimi-K2-Thinking's quantization_config, with a small group."""
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": group,
        "dynamic": False,
        "actorder": None,
        "block_structure": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": list(ignore),
    }


def _block(config: dict) -> tuple[int, int]:
    """A block-FP8 config's block: quant_method fp8's weight_block_size, compressed-tensors' block_structure."""
    if "weight_block_size" in config:
        return tuple(config["weight_block_size"])
    return tuple(config["config_groups"]["group_0"]["weights"]["block_structure"])


def float_quantized_config(strategy: str, block=None, ignore=("lm_head",)) -> dict:
    """llm-compressor's FP8 quantization_config (compressed-tensors float-quantized): weights per ``strategy``
    ("tensor", "channel", "block" of ``block``), activations per token, dynamic (its FP8_DYNAMIC scheme; its
    FP8_BLOCK scheme quantizes them in groups of 128 columns instead, which tests set where they mean it)."""
    weights = {
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False,
        "group_size": None, "block_structure": list(block) if block else None, "actorder": None,
        "observer": "minmax", "observer_kwargs": {},
    }  # fmt: skip
    activations = {
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True,
        "group_size": None, "block_structure": None, "actorder": None, "observer": None,
        "observer_kwargs": {},
    }  # fmt: skip
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {**group, "output_activations": None, "format": "float-quantized"}
        },
        "ignore": list(ignore),
    }


def per_tensor_fp8_config(activation_scheme: str = "static", not_converted=()) -> dict:
    """``quant_method: fp8`` without blocks, as Mistral's FP8 releases write it (transformers' FP8Linear reads it)."""
    return {
        "quant_method": "fp8",
        "activation_scheme": activation_scheme,
        "weight_block_size": None,
        "dequantize": False,
        "modules_to_not_convert": list(not_converted),
    }


def modelopt_config(exclude=()) -> dict:
    return {
        "producer": {"name": "modelopt", "version": "0.31.0"},
        "quantization": {
            "quant_algo": "FP8",
            "kv_cache_quant_algo": None,
            "exclude_modules": list(exclude),
        },
    }


def modelopt_config_json(exclude=("lm_head",)) -> dict:
    """config.json's quantization_config as ModelOpt's export writes it for FP8 (modelopt/torch/export/
    convert_hf_config.py ``convert_hf_quant_config_format``): config_groups spelling per-tensor FP8 out, with
    hf_quant_config.json's exclude_modules as ``ignore`` and its FP8 KV cache as ``kv_cache_scheme``."""
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    group = {"input_activations": dict(fp8), "weights": dict(fp8), "targets": ["Linear"]}
    return {
        "config_groups": {"group_0": group},
        "ignore": list(exclude),
        "quant_algo": "FP8",
        "kv_cache_scheme": dict(fp8),
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quant_method": "modelopt",
    }


def _read_all(src: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def write_quantized(
    src: Path,
    out: Path,
    method: str,
    quantize: Callable[[str], bool],
    config: dict,
    scale_dtype: torch.dtype = torch.float32,
    tensor_names: tuple[str, str] | None = None,
) -> tuple[Path, Path]:
    """Copy checkpoint ``src`` to ``out/quantized`` with every 2-D ``*.weight`` (and in block FP8 every 3-D
    stack of experts, a scale stack beside it) that ``quantize(name)``
    selects stored as ``method`` lays it out, and to ``out/reference`` with those weights dequantized (float32).
    ``config``: the quantization_config (for "fp8_tensor", hf_quant_config.json's object, or a ``quant_method``
    one for config.json); ``tensor_names``: the FP8 formats' weight and activation scale names (default:
    ``weight_scale_inv`` for blocks, ModelOpt's ``weight_scale`` / ``input_scale`` otherwise). "fp8_channel":
    compressed-tensors' per-channel FP8 (a scale an output row). -> (quantized dir, reference dir)."""
    default = ("weight_scale_inv", "") if method == "fp8_block" else ("weight_scale", "input_scale")
    scale_name, input_scale_name = tensor_names or default
    quantized_dir, reference_dir = out / "quantized", out / "reference"
    for d in (quantized_dir, reference_dir):
        d.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")):
                shutil.copy(f, d / f.name)
    q, ref = {}, {}
    for name, t in _read_all(src).items():
        # (3-D: stacked experts, Step-3.5-Flash-FP8's block-FP8 moe.{gate,up,down}_proj)
        stacked = method == "fp8_block" and t.dim() == 3
        if not (name.endswith(".weight") and (t.dim() == 2 or stacked) and quantize(name)):
            q[name] = ref[name] = t
            continue
        prefix = name.removesuffix(".weight")
        if method == "fp8_block":
            fp8, scale = dq.quantize_fp8_block(t, _block(config))
            scale = scale.to(scale_dtype)
            q[name], q[f"{prefix}.{scale_name}"] = fp8, scale
            ref[name] = dq.dequantize_fp8_block(fp8, scale, _block(config))
        elif method in ("fp8_tensor", "fp8_channel"):
            per_tensor = method == "fp8_tensor"
            fp8, scale = (dq.quantize_fp8_tensor if per_tensor else dq.quantize_fp8_channel)(t)
            scale = scale.to(scale_dtype)
            q[name], q[f"{prefix}.{scale_name}"] = fp8, scale
            q[f"{prefix}.{input_scale_name}"] = torch.tensor(0.02)
            ref[name] = (dq.dequantize_fp8_tensor if per_tensor else dq.dequantize_fp8_channel)(
                fp8, scale
            )
        else:
            group = config["config_groups"]["group_0"]["weights"]["group_size"]
            packed, scale = dq.quantize_int4_group(t, group)
            scale = scale.to(torch.bfloat16)
            q[f"{prefix}.weight_packed"], q[f"{prefix}.weight_scale"] = packed, scale
            q[f"{prefix}.weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int32)
            ref[name] = dq.dequantize_int4_group(packed, scale, group)
    save_file(q, str(quantized_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(
        {k: v.float() if v.is_floating_point() else v for k, v in ref.items()},
        str(reference_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    if method == "fp8_tensor" and "quant_method" not in config:
        (quantized_dir / "hf_quant_config.json").write_text(json.dumps(config, indent=2))
    else:
        cfg = json.loads((quantized_dir / "config.json").read_text())
        cfg["quantization_config"] = config
        (quantized_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return quantized_dir, reference_dir


def is_projection(name: str) -> bool:
    """A decoder projection (``*proj*.weight``: q_a_proj, in_proj_qkvz, experts' down_proj, ...), not a
    router, head, embedding or norm, nor DeepSeek MTP's ``eh_proj`` (bf16 in DeepSeek-V3's files)."""
    leaf = name.removesuffix(".weight").rpartition(".")[2]
    return name.endswith(".weight") and "proj" in leaf and leaf != "eh_proj"


def write_mistral4_fp8(src: Path, out: Path) -> tuple[Path, Path]:
    """Checkpoint ``src`` as Mistral Small 4's FP8 release is reported to store it (a third party's read of its
    model-*.safetensors): every projection per-tensor FP8 with a bf16 ``weight_scale_inv`` and
    ``activation_scale`` (``quant_method: fp8`` without blocks, static activations), the fused expert stacks
    FP8 with one ``{name}_scale_inv`` an expert, [E, 1, 1], and an ``{name}_activation_scale`` [E]; router,
    norms, embedding and head as they were. -> (its directory, the dequantized twin's)."""
    quantized, reference = write_quantized(
        src, out, "fp8_tensor", is_projection, per_tensor_fp8_config(), torch.bfloat16,
        ("weight_scale_inv", "activation_scale"),
    )  # fmt: skip
    q, ref = load_file(quantized / "model.safetensors"), load_file(reference / "model.safetensors")
    for name in [n for n in q if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        fp8, scales = zip(*(dq.quantize_fp8_tensor(w) for w in q[name]))
        scale = torch.stack(scales).to(torch.bfloat16)  # [E]
        q[name], q[name + "_scale_inv"] = torch.stack(fp8), scale.reshape(-1, 1, 1)
        q[name + "_activation_scale"] = torch.full_like(scale, 0.02)
        ref[name] = dq.dequantize_fp8_tensor(q[name], scale)
    save_file(q, quantized / "model.safetensors", metadata={"format": "pt"})
    save_file(ref, reference / "model.safetensors", metadata={"format": "pt"})
    return quantized, reference
