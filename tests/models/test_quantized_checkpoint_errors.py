"""Broken quantized checkpoints (tests/helpers/quantized_checkpoints.py's layouts, then damaged): each is refused
with an error that names the file and the tensor or config field, and a legitimate variant loads."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.quantized_checkpoints import (
    block_fp8_config,
    float_quantized_config,
    int4_config,
    is_projection,
    modelopt_config,
    write_quantized,
)
from outpace.checkpoint import CheckpointError
from outpace.layers.quant.linear import QuantizedLinear
from outpace.models.loader import load_model
from outpace.validation import ConfigError

VICTIM = "model.layers.1.self_attn.o_proj"  # a [48, 48] projection of the small Llama
CT_NAMES = ("weight_scale", "input_scale")  # compressed-tensors' scale names

# format -> (write_quantized's layout, its config, the scale dtype, tensor names)
FORMATS = {
    "fp8_block": ("fp8_block", lambda: block_fp8_config((16, 16)), torch.float32, None),
    "fp8_block_bf16": ("fp8_block", lambda: block_fp8_config((16, 16)), torch.bfloat16, None),
    "fp8_tensor": ("fp8_tensor", modelopt_config, torch.float32, None),
    "fp8_channel": (
        "fp8_channel",
        lambda: float_quantized_config("channel"),
        torch.bfloat16,
        CT_NAMES,
    ),
    "int4_group": ("int4_group", lambda: int4_config(8, ["lm_head"]), None, None),
}


@pytest.fixture
def llama(hf_checkpoints):
    return hf_checkpoints("llama")[1]


def quantized(src, tmp_path, fmt: str, quantize=is_projection):
    layout, config, scale_dtype, names = FORMATS[fmt]
    return write_quantized(
        src, tmp_path, layout, quantize, config(), scale_dtype or torch.float32, names
    )[0]


def edit_tensors(q_dir, change) -> None:
    path = q_dir / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def edit_config(q_dir, change) -> None:
    cfg = json.loads((q_dir / "config.json").read_text())
    change(cfg["quantization_config"])
    (q_dir / "config.json").write_text(json.dumps(cfg))


def refused(q_dir, *named: str, error=CheckpointError) -> str:
    """Loading ``q_dir`` raises ``error`` naming each of ``named`` (escaped), -> its message."""
    with pytest.raises(error) as caught:
        load_model(q_dir, torch.float32)
    for name in named:
        assert re.search(re.escape(str(name)), str(caught.value)), (name, str(caught.value))
    return str(caught.value)


SCALES = pytest.mark.parametrize(
    "fmt,scale",
    [
        ("fp8_block", "weight_scale_inv"),
        ("fp8_block_bf16", "weight_scale_inv"),
        ("fp8_tensor", "weight_scale"),
        ("fp8_tensor", "input_scale"),
        ("fp8_channel", "weight_scale"),
        ("int4_group", "weight_scale"),
    ],
)


@SCALES
def test_a_negative_scale_is_refused_naming_file_and_tensor(llama, tmp_path, fmt, scale):
    """A negative scale flips its block's sign: no quantizer writes one."""
    q_dir = quantized(llama, tmp_path, fmt)
    edit_tensors(q_dir, lambda t: t[f"{VICTIM}.{scale}"].view(-1).__setitem__(-1, -0.5))
    message = refused(q_dir, q_dir / "model.safetensors", f"{VICTIM}.{scale}'", "negative")
    assert "-0.5" in message


@SCALES
def test_a_zero_scale_loads(llama, tmp_path, fmt, scale):
    """Zero is a scale real checkpoints hold (an all-zero block's; ModelOpt's input_scale of an expert that
    calibration never reached), and it dequantizes to zeros."""
    q_dir = quantized(llama, tmp_path, fmt)
    edit_tensors(q_dir, lambda t: t[f"{VICTIM}.{scale}"].view(-1).__setitem__(-1, 0.0))
    load_model(q_dir, torch.float32)


def test_a_non_finite_scale_is_refused_naming_file_and_tensor(llama, tmp_path):
    q_dir = quantized(llama, tmp_path, "fp8_block")
    edit_tensors(
        q_dir, lambda t: t[f"{VICTIM}.weight_scale_inv"].view(-1).__setitem__(0, torch.inf)
    )
    refused(q_dir, q_dir / "model.safetensors", f"{VICTIM}.weight_scale_inv'", "inf")


def test_a_stack_of_experts_with_a_negative_scale_is_refused(tmp_path):
    """Step-3.5-Flash-FP8's block-FP8 stacks of experts."""
    from helpers.step3p5_checkpoints import CONFIG, write_checkpoint

    (tmp_path / "source").mkdir()
    source, _ = write_checkpoint(tmp_path / "source", CONFIG)
    q_dir, _ = write_quantized(
        source, tmp_path, "fp8_block", is_projection, block_fp8_config((4, 8))
    )
    victim = "model.layers.1.moe.down_proj.weight_scale_inv"
    edit_tensors(q_dir, lambda t: t[victim].view(-1).__setitem__(3, -2.0))
    refused(q_dir, q_dir / "model.safetensors", victim, "negative")


@pytest.fixture(scope="module")
def mistral4_fp8(tmp_path_factory):
    """Mistral Small 4's FP8 release layout: fused expert stacks in per-tensor FP8, a scale an expert."""
    from helpers.deepseek_models import make_hf_mistral4
    from helpers.hf_models import save_hf_model
    from helpers.quantized_checkpoints import write_mistral4_fp8

    src = save_hf_model(make_hf_mistral4(), tmp_path_factory.mktemp("mistral4"))
    return write_mistral4_fp8(src, tmp_path_factory.mktemp("mistral4-fp8"))[0]


def _copy(src, tmp_path):
    import shutil

    return shutil.copytree(src, tmp_path / "q")


@pytest.mark.parametrize(
    "suffix", ["gate_up_proj_scale_inv", "down_proj_scale_inv", "down_proj_activation_scale"]
)
def test_fused_expert_stacks_with_a_negative_scale_are_refused(mistral4_fp8, tmp_path, suffix):
    q_dir = _copy(mistral4_fp8, tmp_path)
    victim = f"model.layers.1.mlp.experts.{suffix}"
    edit_tensors(q_dir, lambda t: t[victim].view(-1).__setitem__(1, -1.0))
    refused(q_dir, q_dir / "model.safetensors", victim, "negative")


def test_fused_expert_stacks_with_more_than_one_scale_an_expert_are_refused(mistral4_fp8, tmp_path):
    """[E, 2] where [E] or [E, 1, 1] belongs: loaded before, then read as 2E scales."""
    q_dir = _copy(mistral4_fp8, tmp_path)
    victim = "model.layers.1.mlp.experts.down_proj_scale_inv"
    edit_tensors(
        q_dir, lambda t: t.__setitem__(victim, t[victim].reshape(-1, 1).expand(-1, 2).contiguous())
    )
    refused(q_dir, q_dir / "model.safetensors", victim, "one scale an expert")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn])
@pytest.mark.parametrize("fmt", ["fp8_block", "int4_group"])
def test_a_scale_of_a_dtype_no_scale_takes_is_refused(llama, tmp_path, fmt, dtype):
    """float64 raised a TypeError from torch.empty that named nothing."""
    scale = "weight_scale_inv" if fmt == "fp8_block" else "weight_scale"
    q_dir = quantized(llama, tmp_path, fmt)
    edit_tensors(
        q_dir, lambda t: t.__setitem__(f"{VICTIM}.{scale}", t[f"{VICTIM}.{scale}"].to(dtype))
    )
    refused(q_dir, q_dir / "model.safetensors", f"{VICTIM}.{scale}'", "dtype")


def test_a_per_tensor_scale_stored_as_one_element_loads_as_a_scalar_one(llama, tmp_path):
    """ModelOpt writes a per-tensor scale as [] or [1] (layers/quant/linear.py Fp8Tensor): [1] was refused."""
    q_dir = quantized(llama, tmp_path / "scalar", "fp8_tensor")
    expected = load_model(q_dir, torch.float32)
    edit_tensors(
        q_dir,
        lambda t: t.update(
            {n: v.reshape(1) for n, v in t.items() if n.endswith(("weight_scale", "input_scale"))}
        ),
    )
    got = load_model(q_dir, torch.float32)
    pairs = [
        (a, b) for a, b in zip(got.modules(), expected.modules()) if isinstance(a, QuantizedLinear)
    ]
    assert len(pairs) == 7 * 3
    for a, b in pairs:
        assert a.scale.shape == (1,) and b.scale.shape == ()
        torch.testing.assert_close(a.dequantized(), b.dequantized(), rtol=0, atol=0)


def test_a_scale_of_the_wrong_shape_names_the_block_size_field(llama, tmp_path):
    """Written in blocks of 16, the config says 32: the error names the tensor, its file and the field."""
    q_dir = quantized(llama, tmp_path, "fp8_block")
    edit_config(q_dir, lambda c: c.__setitem__("weight_block_size", [32, 32]))
    refused(
        q_dir, q_dir / "model.safetensors", "weight_scale_inv' has shape (3, 3)", "(2, 2)",
        "quantization_config.weight_block_size", q_dir / "config.json",
    )  # fmt: skip


def test_int4_groups_that_do_not_divide_the_columns_are_refused(llama, tmp_path):
    """group_size 32 over 48 columns, the scale stored [48, 1] (48 // 32): loaded before, its last 16 columns
    without a scale of their own."""
    q_dir = quantized(llama, tmp_path, "int4_group", lambda n: n == f"{VICTIM}.weight")
    edit_tensors(
        q_dir,
        lambda t: t.__setitem__(
            f"{VICTIM}.weight_scale", t[f"{VICTIM}.weight_scale"][:, :1].clone()
        ),
    )
    edit_config(q_dir, lambda c: c["config_groups"]["group_0"]["weights"].update(group_size=32))
    refused(
        q_dir, q_dir / "model.safetensors", f"{VICTIM}.weight_scale'", "not whole groups of 32",
        "group_size", q_dir / "config.json",
    )  # fmt: skip


def test_int4_weight_shape_missing_or_wrong_is_refused_naming_its_file(llama, tmp_path):
    """A missing weight_shape read as [0, 0]; a wrong one was reported without its file."""
    q_dir = quantized(llama, tmp_path, "int4_group")
    key = f"{VICTIM}.weight_shape"
    edit_tensors(q_dir, lambda t: t.__setitem__(key, torch.tensor([48, 40], dtype=torch.int32)))
    refused(q_dir, q_dir / "model.safetensors", key, "[48, 40]")
    edit_tensors(q_dir, lambda t: t.pop(key))
    refused(q_dir, q_dir / "model.safetensors", f"{VICTIM}.weight_packed'", key)


def test_an_ignore_pattern_that_is_no_regular_expression_is_refused(llama, tmp_path):
    """A ``re:`` entry that does not compile raised re.error, naming neither file nor field."""
    q_dir = quantized(llama, tmp_path, "int4_group")
    edit_config(q_dir, lambda c: c.__setitem__("ignore", ["lm_head", "re:(.*o_proj"]))
    refused(q_dir, q_dir / "config.json", "quantization_config.ignore", "re:(", error=ConfigError)


def test_two_different_lists_of_unquantized_modules_are_refused(llama, tmp_path):
    """``modules_to_not_convert`` and its synonym ``ignored_layers`` both given: the second was ignored."""
    q_dir = quantized(
        llama, tmp_path, "fp8_block", lambda n: is_projection(n) and "o_proj" not in n
    )
    edit_config(
        q_dir, lambda c: c.update(modules_to_not_convert=["lm_head"], ignored_layers=["o_proj"])
    )
    refused(
        q_dir, q_dir / "config.json", "modules_to_not_convert", "ignored_layers", error=ConfigError
    )
    edit_config(q_dir, lambda c: c.update(ignored_layers=["lm_head"]))  # (the same list: fine)
    load_model(q_dir, torch.float32)
