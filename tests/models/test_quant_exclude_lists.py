"""A quantization config's list of unquantized modules (compressed-tensors' ``ignore``, ``modules_to_not_convert``,
ModelOpt's ``exclude_modules``) naming a module that neither the model nor its checkpoint has is refused naming the
file, the field and the names (layers/quant/loading.py ``_refuse_unmatched_excludes``): before, it loaded silently.
What published lists carry still loads: the head of a model that ties it (no ``lm_head`` tensor), a name wrapped
otherwise than the checkpoint (``language_model.model.layers.*`` beside ``model.layers.*``), patterns that match
nothing on this layout (``re:visual.*``, MoE routers' ``re:.*mlp.gate$`` on a dense model, ModelOpt wildcards) and
class names."""

import pytest
import torch

from helpers.quantized_checkpoints import (
    block_fp8_config,
    float_quantized_config,
    int4_config,
    is_projection,
    modelopt_config,
    write_quantized,
)
from outpace.layers.quant.linear import QuantizedLinear
from outpace.layers.quant.loading import stored_tensors
from outpace.layers.quant.scheme import FP8_TENSOR, QuantScheme, parse_quantization_config
from outpace.models.loader import load_model
from outpace.validation import ConfigError

MISSPELT = "model.layers.0.mlp.gaet_proj"
BEYOND = "model.layers.7.self_attn.o_proj"  # the small Llama has 3 layers

# format -> (write_quantized's layout, its config with ``names`` as its list, the list's file, its field, how the
# list matches: layers/quant/scheme.py QuantScheme.exclude_match)
FORMATS = {
    "compressed-tensors int4": (
        "int4_group",
        lambda names: int4_config(8, names),
        "config.json",
        "quantization_config.ignore",
        "regex",
    ),
    "compressed-tensors fp8": (
        "fp8_channel",
        lambda names: float_quantized_config("channel", ignore=names),
        "config.json",
        "quantization_config.ignore",
        "regex",
    ),
    "fp8 modules_to_not_convert": (
        "fp8_block",
        lambda names: block_fp8_config((16, 16), modules_to_not_convert=names),
        "config.json",
        "quantization_config.modules_to_not_convert",
        "name",
    ),
    "modelopt exclude_modules": (
        "fp8_tensor",
        lambda names: modelopt_config(names),
        "hf_quant_config.json",
        "quantization.exclude_modules",
        "wildcard",
    ),
}
CT_NAMES = ("weight_scale", "input_scale")  # compressed-tensors' scale names


def quantized(src, tmp_path, fmt: str, names: list[str]):
    """``src`` written in ``fmt`` with ``names`` as its list, every projection the list does not keep quantized
    (as a quantizer that honours it writes them)."""
    layout, config, _, _, style = FORMATS[fmt]
    kept = QuantScheme(FP8_TENSOR, "list", exclude=tuple(names), exclude_match=style)
    tensor_names = CT_NAMES if layout == "fp8_channel" else None
    scales = torch.bfloat16 if layout == "int4_group" else torch.float32
    return write_quantized(
        src,
        tmp_path,
        layout,
        lambda n: is_projection(n) and not kept.excludes(n.removesuffix(".weight")),
        config(names),
        scales,
        tensor_names,
    )[0]


@pytest.fixture
def llama(hf_checkpoints):
    return hf_checkpoints("llama")[1]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("unmatched", [[MISSPELT], [MISSPELT, BEYOND]], ids=["one", "two"])
def test_a_list_naming_a_module_nobody_has_is_refused_naming_file_field_and_names(
    llama, tmp_path, fmt, unmatched
):
    q_dir = quantized(llama, tmp_path, fmt, ["lm_head", *unmatched])
    with pytest.raises(ConfigError) as err:
        load_model(q_dir, torch.float32)
    _, _, file, field, _ = FORMATS[fmt]
    message = str(err.value)
    assert message.startswith(f"{q_dir / file}: {field} "), message
    assert str(unmatched) in message and "'lm_head'" not in message, message


PUBLISHED = {
    # llm-compressor's Qwen3.5 MoE recipe (examples/quantization_w8a8_fp8/qwen3_5_moe.py) on a dense text model
    "compressed-tensors fp8": [
        "re:.*lm_head",
        "re:visual.*",
        "re:model.visual.*",
        "re:.*mlp.gate$",
        "re:.*embed_tokens$",
        "Qwen3VLVisionBlock",  # (a class name: compressed-tensors matches module classes too)
        "model.layers.0.self_attn.q_proj",
    ],
    # a name wrapped as the quantizer's model class wraps it (model.layers.* under another root)
    "compressed-tensors int4": ["lm_head", "language_model.model.layers.1.mlp.down_proj"],
    "fp8 modules_to_not_convert": ["lm_head", "o_proj", "model.layers.1"],
    "modelopt exclude_modules": ["lm_head", "*.mlp.gate*", "mtp*", "model.layers.2.mlp.up_proj"],
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_published_lists_load(llama, tmp_path, fmt):
    model = load_model(quantized(llama, tmp_path, fmt, PUBLISHED[fmt]), torch.float32)
    assert any(isinstance(m, QuantizedLinear) for m in model.modules())


def test_a_tied_head_named_in_the_list_loads(hf_checkpoints, tmp_path):
    """A model that ties its head stores no lm_head tensor; llm-compressor's default list names it all the same."""
    src = hf_checkpoints("llama-tied-odd-headdim")[1]
    q_dir = quantized(src, tmp_path, "compressed-tensors int4", ["lm_head"])
    assert not any(name.startswith("lm_head") for name in stored_tensors(q_dir))
    load_model(q_dir, torch.float32)


def test_the_match_is_by_dotted_name_not_by_substring():
    scheme = parse_quantization_config(
        float_quantized_config("channel", ignore=["layers.0.mlp", "ers.0.mlp", "re:nothing"]),
        "c.json",
    )
    modules = {"model", "model.layers", "model.layers.0", "model.layers.0.mlp"}
    assert scheme.unmatched_excludes(modules) == ("ers.0.mlp",)
