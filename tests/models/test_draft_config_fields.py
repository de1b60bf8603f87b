"""Draft and Gemma config fields are refused by name, the config.json and the field: an EAGLE3, DFlash or Gemma 4
assistant draft that does not fit its target names its config.json (they named the directory, or nothing) and the
field, a DFlash draft without fc.weight its weight file; an ``eagle_config`` key outpace does not implement, or a
value of a known one that changes what the draft computes, is refused rather than ignored, while the keys published
drafts carry with the values outpace computes (ModelOpt's export) load; Gemma 3, Gemma 4 and the Gemma 4 assistant
refuse an ``attention_bias`` that is not a JSON bool (``bool("false")`` gave biases)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from helpers.gemma_models import GEMMA3_TEXT, GEMMA4_TEXT
from helpers.gemma_sampling import GEMMA4_TINY, VOCAB, make_gemma4_assistant, make_tiny_gemma
from helpers.hf_models import save_hf_model
from outpace.model_config import ModelConfig
from outpace.models.drafts.dflash import load_dflash_draft
from outpace.models.drafts.eagle3 import DraftMismatchError, Eagle3Config, load_eagle3_draft
from outpace.models.drafts.gemma4_assistant import load_gemma4_assistant
from outpace.models.loader import load_model
from outpace.registry import model_class
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SOURCE = "draft/config.json"


@pytest.fixture(scope="module")
def tinypy():
    return load_model(ZOO / "tinypy", torch.float32, progress=False)


def eagle3_draft(tmp_path: Path, edit) -> Path:
    """A copy of zoo/tinypy-eagle3 whose config.json dict ``edit`` changes in place."""
    out = tmp_path / "tinypy-eagle3"
    shutil.copytree(ZOO / "tinypy-eagle3", out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_a_draft_that_does_not_fit_names_its_config_file_and_field(tmp_path, tinypy):
    d = eagle3_draft(tmp_path, lambda c: c.update(target_hidden_size=2 * c["hidden_size"]))
    with pytest.raises(DraftMismatchError) as error:
        load_eagle3_draft(d, tinypy, torch.float32, "cpu")
    message = str(error.value)
    assert message.startswith(f"{d / 'config.json'}: "), message
    assert "target_hidden_size 512 != target hidden_size 256" in message, message


def zoo_eagle3(**eagle_config) -> dict:
    cfg = json.loads((ZOO / "tinypy-eagle3" / "config.json").read_text())
    cfg["eagle_config"].update(eagle_config)
    return cfg


EAGLE_CONFIG_REFUSED = [
    # unknown keys: a misspelt aux ids key, and another reader's switch (TensorRT-LLM's Eagle3DraftModel)
    ("aux_hidden_state_layer_ids", [1, 3, 5]),
    ("norm_before_fc", True),
    ("eh_proj_before_attn", True),
    ("return_hidden_post_norm", True),
    # ModelOpt's keys, at a value that is not what outpace computes
    ("use_input_layernorm_in_first_layer", False),
    ("use_last_layernorm", False),
    ("use_mtp_layernorm", True),
    ("parallel_draft_step", 2),
    ("use_aux_hidden_state", False),
    # known keys of the wrong type
    ("use_last_layernorm", "true"),
    ("next_layer_regular", "yes"),
    ("parallel_draft_heads_num_layers", "1"),
]


@pytest.mark.parametrize(
    "key, value", EAGLE_CONFIG_REFUSED, ids=[f"{k}={v!r}" for k, v in EAGLE_CONFIG_REFUSED]
)
def test_eagle_config_keys_outpace_does_not_implement_are_refused_by_name(key, value):
    with pytest.raises(ConfigError) as error:
        Eagle3Config.from_dict(zoo_eagle3(**{key: value}), SOURCE)
    message = str(error.value)
    assert message.startswith(f"{SOURCE}: field 'eagle_config.{key}'"), message
    assert repr(value) in message, message


# NVIDIA ModelOpt's export (modelopt/torch/export/plugins/hf_spec_export.py export_spec_ckpt_config) of an EAGLE3
# Llama draft: every key it writes, at the values of an EAGLE3 draft; a key its model lacks is written null
MODELOPT_EAGLE_CONFIG = {
    "eagle_aux_hidden_state_layer_ids": [1, 3, 5],
    "use_aux_hidden_state": True,
    "use_input_layernorm_in_first_layer": True,
    "use_last_layernorm": True,
    "use_mtp_layernorm": False,
    "next_layer_regular": True,
    "parallel_draft_step": 1,
    "parallel_draft_heads_num_layers": 1,
}


@pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])
def test_modelopt_exported_eagle_config_loads(tmp_path, tinypy, nulls):
    eagle = dict(MODELOPT_EAGLE_CONFIG)
    if nulls:
        eagle.update({k: None for k in eagle if k != "eagle_aux_hidden_state_layer_ids"})
    draft = load_eagle3_draft(
        eagle3_draft(tmp_path, lambda c: c.update(eagle_config=eagle)), tinypy, torch.float32, "cpu"
    )
    assert draft.config.aux_layer_ids == (1, 3, 5)


def gemma_config(family: str, **fields) -> dict:
    if family == "gemma3":
        written = transformers.Gemma3TextConfig(**GEMMA3_TEXT).to_dict()
        return {**written, "architectures": ["Gemma3ForCausalLM"], **fields}
    written = transformers.Gemma4TextConfig(**GEMMA4_TEXT).to_dict()
    return {**written, "architectures": ["Gemma4ForCausalLM"], **fields}


def build(cfg: dict):
    model_cfg = ModelConfig.from_dict(cfg, SOURCE)
    with torch.device("meta"):
        return model_class(model_cfg.architecture)(model_cfg)


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
@pytest.mark.parametrize("value", ["false", 0, "yes"])
def test_gemma_attention_bias_not_a_bool_is_refused_by_name(family, value):
    with pytest.raises(ConfigError) as error:
        build(gemma_config(family, attention_bias=value))
    message = str(error.value)
    assert message.startswith(f"{SOURCE}: field 'attention_bias' must be true or false"), message
    assert repr(value) in message, message


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
def test_gemma_attention_bias_true_false_and_null_build(family):
    def biases(value) -> int:
        model = build(gemma_config(family, attention_bias=value))
        return sum(name.endswith("q_proj.bias") for name, _ in model.named_parameters())

    assert biases(None) == biases(False) == 0
    assert biases(True) == GEMMA3_TEXT["num_hidden_layers"]


def tiny_assistant(tmp_path: Path):
    """A tiny Gemma 4 target, loaded, and the directory of an assistant written by transformers that fits it."""
    _, target_dir = make_tiny_gemma("gemma4", tmp_path / "target")
    target = load_model(target_dir, torch.float32, progress=False)
    draft_dir = save_hf_model(make_gemma4_assistant(), tmp_path / "assistant")
    load_gemma4_assistant(draft_dir, target, torch.float32, "cpu")  # as written, it loads
    return target, draft_dir


def edit_config(draft_dir: Path, edit) -> Path:
    """Change ``draft_dir``'s config.json dict in place with ``edit``; its path."""
    path = draft_dir / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
    return path


def test_gemma4_assistant_attention_bias_not_a_bool_is_refused_by_name(tmp_path):
    target, draft_dir = tiny_assistant(tmp_path)
    path = edit_config(draft_dir, lambda c: c["text_config"].update(attention_bias="false"))
    with pytest.raises(ConfigError) as error:
        load_gemma4_assistant(draft_dir, target, torch.float32, "cpu")
    message = str(error.value)
    assert message.startswith(f"{path}: field 'text_config.attention_bias' must be true or false")
    assert "'false'" in message, message


def test_a_quantized_gemma4_assistant_is_refused_by_name(tmp_path):
    """Its layers are plain: a quantization_config (at the top or in text_config) or ModelOpt's
    hf_quant_config.json is refused naming the file and the field, not ignored."""
    from helpers.quantized_checkpoints import modelopt_config

    target, draft_dir = tiny_assistant(tmp_path)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    for edit, field in [
        (lambda c: c.update(quantization_config=fp8), "'quantization_config'"),
        (
            lambda c: c["text_config"].update(quantization_config=fp8),
            "'text_config.quantization_config'",
        ),
    ]:
        path = draft_dir / "config.json"
        original = path.read_text()
        edit_config(draft_dir, edit)
        with pytest.raises(ConfigError) as error:
            load_gemma4_assistant(draft_dir, target, torch.float32, "cpu")
        assert str(error.value).startswith(f"{path}: field {field}"), str(error.value)
        path.write_text(original)
    (draft_dir / "hf_quant_config.json").write_text(json.dumps(modelopt_config()))
    with pytest.raises(
        ConfigError, match="hf_quant_config.json: declares the Gemma 4 assistant draft"
    ):
        load_gemma4_assistant(draft_dir, target, torch.float32, "cpu")


# (an edit of the assistant's text_config, what the mismatch names: the field and its value)
ASSISTANT_MISFITS = {
    "vocab_size": (
        {"vocab_size": 2 * VOCAB},
        f"text_config.vocab_size {2 * VOCAB} != the target's",
    ),
    "head_dim": (
        {"head_dim": 2 * GEMMA4_TINY["head_dim"]},
        f"layer 0 (sliding_attention): text_config.head_dim {2 * GEMMA4_TINY['head_dim']}",
    ),
    "per_layer_config": (
        {"per_layer_config": {"1": {"head_dim": 8}}},
        "layer 1 (full_attention): text_config.per_layer_config.1.head_dim 8",
    ),
    "sliding_window": (
        {"sliding_window": 3},
        "window 3 (text_config.sliding_window, layer_types)",
    ),
}


@pytest.mark.parametrize("field", list(ASSISTANT_MISFITS))
def test_a_gemma4_assistant_that_does_not_fit_names_its_config_file_and_field(tmp_path, field):
    """It said "Gemma 4 assistant does not fit the target: ..." without the file, and head_dim and vocab_size
    without saying they sit in text_config (nor where a full layer's head_dim is given)."""
    target, draft_dir = tiny_assistant(tmp_path)
    fields, named = ASSISTANT_MISFITS[field]
    path = edit_config(draft_dir, lambda c: c["text_config"].update(fields))
    with pytest.raises(DraftMismatchError) as error:
        load_gemma4_assistant(draft_dir, target, torch.float32, "cpu")
    message = str(error.value)
    assert message.startswith(f"{path}: the Gemma 4 assistant does not fit the target: "), message
    assert named in message, message


def dflash_draft(tmp_path: Path, edit=None, tensors=None) -> Path:
    """A copy of zoo/tinypy-dflash whose config.json dict ``edit`` changes and whose tensors dict ``tensors``
    changes, in place."""
    out = tmp_path / "tinypy-dflash"
    shutil.copytree(ZOO / "tinypy-dflash", out)
    if edit is not None:
        edit_config(out, edit)
    if tensors is not None:
        weights = load_file(out / "model.safetensors")
        tensors(weights)
        save_file(weights, out / "model.safetensors")
    return out


def top_level_mask(cfg: dict) -> None:
    """mask_token_id at the top level (z-lab's ``_draft_value`` reads it there too), outside the vocabulary."""
    cfg["dflash_config"].pop("mask_token_id")
    cfg["mask_token_id"] = 5000


DFLASH_MISFITS = {  # (the config.json edit, what the mismatch names)
    "dflash_config.target_layer_ids": (
        lambda c: c["dflash_config"].update(target_layer_ids=[1, 3, 7]),
        "dflash_config.target_layer_ids [1, 3, 7] name layers [7]",
    ),
    "dflash_config.mask_token_id": (
        lambda c: c["dflash_config"].update(mask_token_id=4096),
        "dflash_config.mask_token_id 4096 is outside the target vocabulary [0, 4096)",
    ),
    "mask_token_id": (top_level_mask, ": mask_token_id 5000 is outside the target vocabulary"),
    "num_target_layers": (
        lambda c: c.update(num_target_layers=7),
        "num_target_layers 7 != the target's 6 layers",
    ),
}


@pytest.mark.parametrize("field", list(DFLASH_MISFITS))
def test_a_dflash_draft_that_does_not_fit_names_its_config_file_and_field(tmp_path, tinypy, field):
    """It said "DFlash draft <directory> does not fit the target", and target_layer_ids or mask_token_id without
    saying which of dflash_config's and the top level's."""
    edit, named = DFLASH_MISFITS[field]
    d = dflash_draft(tmp_path, edit)
    with pytest.raises(DraftMismatchError) as error:
        load_dflash_draft(d, tinypy, torch.float32, "cpu")
    message = str(error.value)
    assert message.startswith(f"{d / 'config.json'}: the DFlash draft does not fit the target: ")
    assert named in message, message


def test_a_dflash_draft_without_fc_names_its_weight_file(tmp_path, tinypy):
    """It said "DFlash draft <directory> has no fc.weight tensor": the weight file is named (config.json is not at
    fault), with the field whose target layers fc projects."""
    d = dflash_draft(tmp_path, tensors=lambda t: t.pop("fc.weight"))
    with pytest.raises(DraftMismatchError) as error:
        load_dflash_draft(d, tinypy, torch.float32, "cpu")
    message = str(error.value)
    assert message.startswith(f"{d / 'model.safetensors'}: "), message
    assert (
        "no fc.weight tensor" in message and "dflash_config.target_layer_ids [1, 3, 5]" in message
    )
