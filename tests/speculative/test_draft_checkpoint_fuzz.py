"""Damaged draft checkpoints are refused by name, before the engine serves: copies of the zoo's drafts (EAGLE3 in
the native and the speculators format, DFlash, a standalone draft) and of other draft configs (Qwen3-Next's MTP
layers, a Gemma 4 assistant) with one config.json field or one weight tensor changed.

- every ``ConfigError`` of a draft's config names its config.json and the field;
- a field of the public formats that changes what the draft computes and that outpace does not implement is
  refused by name (the sources: models/drafts/eagle3.py and dflash.py, where each is read or refused);
- a token map (d2t, t2d) of the wrong dtype or with ids outside the target's vocabulary names its file and tensor,
  as the loader does for a missing, misshapen, mistyped or unknown tensor."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from outpace import LLM
from outpace.checkpoint import CheckpointError
from outpace.config import SpeculativeConfig
from outpace.model_config import ModelConfig
from outpace.models.drafts.dflash import load_dflash_draft
from outpace.models.drafts.eagle3 import DraftMismatchError, load_eagle3_draft
from outpace.models.drafts.gemma4_assistant import AssistantConfig
from outpace.models.loader import build_model, load_model
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
REFUSED = (ConfigError, DraftMismatchError, CheckpointError)


@pytest.fixture(scope="module")
def tinypy():
    return load_model(ZOO / "tinypy", torch.float32, progress=False)


@pytest.fixture(scope="module")
def tinyds():
    return load_model(ZOO / "tinyds", torch.float32, progress=False)


def copy_of(tmp_path: Path, name: str, config=None, tensors=None) -> Path:
    """A copy of zoo/``name`` whose config.json dict and tensor dict the callables edit in place."""
    out = tmp_path / name
    shutil.copytree(ZOO / name, out)
    edit(out, config, tensors)
    return out


def edit(out: Path, config=None, tensors=None) -> None:
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(out / "model.safetensors")
        tensors(t)
        save_file(t, out / "model.safetensors")


def speculators_copy(tmp_path: Path, config=None) -> Path:
    """zoo/tinypy-eagle3 in vLLM's speculators format (speculators Eagle3SpeculatorConfig): the layer's shapes
    in transformer_layer_config, its tensors under layers.0."""
    out = copy_of(tmp_path, "tinypy-eagle3")
    native = json.loads((out / "config.json").read_text())
    layer_keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads")
    layer_keys += ("num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta")
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"num_hidden_layers": 1, **{k: native[k] for k in layer_keys}},
        "draft_vocab_size": native["draft_vocab_size"],
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": native["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"
        ],
    }
    (out / "config.json").write_text(json.dumps(cfg))
    edit(
        out,
        config,
        lambda t: t.update({k.replace("midlayer.", "layers.0."): t.pop(k) for k in list(t)}),
    )
    return out


def setter(*path, value=None, delete=False):
    """An edit of a config dict: the field at ``path`` (nested keys) set to ``value``, or removed."""

    def apply(cfg):
        for key in path[:-1]:
            cfg = cfg[key]
        if delete:
            cfg.pop(path[-1])
        else:
            cfg[path[-1]] = value

    return apply


def both(*edits):
    return lambda cfg: [e(cfg) for e in edits]


def assert_names(error: pytest.ExceptionInfo, *names) -> None:
    message = str(error.value)
    for name in names:
        assert str(name) in message, f"{name!r} not named in: {message}"


# ---- every ConfigError of a draft's config names the file and the field ----------------------------------------

EAGLE3_FIELDS = [  # (field, value): each was read with bool() / float() (True for "false"), or failed unnamed
    ("bias", "false"),
    ("norm_before_residual", "yes"),
    ("use_aux_norm", 1),
    ("fc_norm", "x"),
    ("embed_scale", "x"),
    ("embed_scale", -2.0),
    ("target_model_type", 3),
]


@pytest.mark.parametrize("field, value", EAGLE3_FIELDS)
def test_eagle3_config_errors_name_the_file_and_field(tmp_path, tinypy, field, value):
    d = copy_of(tmp_path, "tinypy-eagle3", setter(field, value=value))
    with pytest.raises(ConfigError) as error:
        load_eagle3_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "config.json", f"'{field}'")


SPECULATORS_FIELDS = [  # (edit, the field named): DraftMismatchError without the file, or transformers' errors
    (setter("speculators_model_type", value="medusa"), "speculators_model_type"),
    (setter("norm_before_fc", value=True), "norm_before_fc"),
    (setter("norm_before_residual", value="no"), "norm_before_residual"),
    (setter("transformer_layer_config", value=[1]), "transformer_layer_config"),
    (setter("transformer_layer_config", "model_type", value="qwen3"), "model_type"),
    (setter("transformer_layer_config", "hidden_size", value="x"), "hidden_size"),
    (setter("transformer_layer_config", "num_attention_heads", value=0), "num_attention_heads"),
    (setter("transformer_layer_config", "num_hidden_layers", value=2), "num_hidden_layers"),
]


@pytest.mark.parametrize(
    "config, field", SPECULATORS_FIELDS, ids=[f for _, f in SPECULATORS_FIELDS]
)
def test_speculators_config_errors_name_the_file_and_field(tmp_path, tinypy, config, field):
    d = speculators_copy(tmp_path, config)
    with pytest.raises(ConfigError) as error:
        load_eagle3_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "config.json", field)


def test_speculators_copy_loads(tmp_path, tinypy):
    load_eagle3_draft(speculators_copy(tmp_path), tinypy, torch.float32, "cpu")


DFLASH_FIELDS = [  # AttributeError, a DraftMismatchError for a mistyped field, or errors without the file
    (setter("dflash_config", value="x"), "dflash_config"),
    (setter("dflash_config", "mask_token_id", value="x"), "mask_token_id"),
    (setter("dflash_config", "mask_token_id", value=-1), "mask_token_id"),
    (setter("dflash_config", "target_layer_ids", value=[1, -3]), "target_layer_ids"),
    (
        both(setter("block_size", delete=True), setter("dflash_config", "block_size", value=1)),
        "block_size",
    ),
    (setter("dflash_config", "block_size", value=4), "block_size"),  # the top level's is 8
    (setter("dflash_config", "mask_token_id", delete=True), "mask_token_id"),
    (setter("num_target_layers", value="6"), "num_target_layers"),
    (setter("hidden_size", value="x"), "hidden_size"),
]


@pytest.mark.parametrize("config, field", DFLASH_FIELDS, ids=[f for _, f in DFLASH_FIELDS])
def test_dflash_config_errors_name_the_file_and_field(tmp_path, tinypy, config, field):
    d = copy_of(tmp_path, "tinypy-dflash", config)
    with pytest.raises(ConfigError) as error:
        load_dflash_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "config.json", field)


@pytest.mark.parametrize(
    "config, field",
    [
        (setter("hidden_size", value="x"), "hidden_size"),
        (setter("rms_norm_eps", value="x"), "rms_norm_eps"),
    ],
)
def test_standalone_draft_config_errors_name_the_file_and_field(tmp_path, config, field):
    d = copy_of(tmp_path, "tinypy-draft", config)
    with pytest.raises(ConfigError) as error:
        LLM(str(ZOO / "tinypy"), device="cpu", speculative=SpeculativeConfig("draft", draft=str(d)))
    assert_names(error, d / "config.json", field)


@pytest.mark.parametrize("value", ["2", 1.5, -1])
def test_mtp_layer_count_names_the_file_and_field(tmp_path, value):
    """Qwen3-Next's mtp_num_hidden_layers went through int(): "2" read as 2, 1.5 as 1, -1 as no layers."""
    from transformers import Qwen3NextConfig

    from helpers.hybrid_models import HYBRIDS

    cfg = Qwen3NextConfig(**HYBRIDS["qwen3_next"][1]).to_dict()
    cfg.update(architectures=["Qwen3NextForCausalLM"], mtp_num_hidden_layers=value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as error:
        build_model(ModelConfig.from_pretrained(tmp_path), torch.float32, "meta")
    assert_names(error, path, "'mtp_num_hidden_layers'")


@pytest.mark.parametrize(
    "raw, field",
    [({}, "text_config"), ({"text_config": {"hidden_size": 8}}, "num_hidden_layers")],
)
def test_gemma4_assistant_config_errors_name_the_file_and_field(raw, field):
    """A missing text_config or layer count raised KeyError, naming neither."""
    with pytest.raises(ConfigError) as error:
        AssistantConfig.from_dict(raw, "assistant/config.json")
    assert_names(error, "assistant/config.json", field)


# ---- fields that change what the draft computes: implemented or refused, never ignored ----------------------------

EAGLE3_UNIMPLEMENTED = [
    # SpecForge configs/qwen3-30B-A3B-eagle3-moe-draft.json, gpt-oss-20B-eagle3.json: MoE draft layers
    (setter("architectures", value=["Qwen3MoEForCausalLMEagle3"]), "architectures"),
    (setter("architectures", value=["GptOssForCausalLMEagle3"]), "architectures"),
    # vLLM llama_eagle3.py: no fc, the target's last hidden state as it is
    (setter("eagle_config", "use_aux_hidden_state", value=False), "use_aux_hidden_state"),
    # vLLM llama_eagle3.py: LogitsProcessor(scale=logit_scale)
    (setter("logit_scale", value=2.0), "logit_scale"),
    (setter("quantization_config", value={"quant_method": "fp8"}), "quantization_config"),
]


@pytest.mark.parametrize(
    "config, field", EAGLE3_UNIMPLEMENTED, ids=[f for _, f in EAGLE3_UNIMPLEMENTED]
)
def test_unimplemented_eagle3_fields_are_refused_by_name(tmp_path, tinypy, config, field):
    d = copy_of(tmp_path, "tinypy-eagle3", config)
    with pytest.raises(ConfigError) as error:
        load_eagle3_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "config.json", field)


def test_speculators_without_norm_before_residual_is_refused(tmp_path, tinypy):
    """speculators' config defaults it to false, vLLM's update_eagle3 to true: absent, either is meant."""
    d = speculators_copy(tmp_path, setter("norm_before_residual", delete=True))
    with pytest.raises(ConfigError) as error:
        load_eagle3_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "config.json", "norm_before_residual")


DFLASH_UNIMPLEMENTED = [
    # z-lab dflash/model.py DFlash2DraftModel; SpecForge configs/deepseek-v2-lite-dflash.json
    (setter("architectures", value=["DFlash2DraftModel"]), "architectures"),
    (setter("architectures", value=["DeepseekDFlashDraftModel"]), "architectures"),
    # z-lab Qwen3DFlashAttention: is_causal true masks the block causally
    (setter("is_causal", value=True), "is_causal"),
    # z-lab _raw_input_embeddings, compute_logits (from dflash_config, else the top level)
    (setter("dflash_config", "input_embedding_scale", value=2.0), "input_embedding_scale"),
    (setter("dflash_config", "output_multiplier", value=0.5), "output_multiplier"),
    (setter("final_logit_softcapping", value=20.0), "final_logit_softcapping"),
    # DFlash2's fields, and any other unknown to DFlashDraftModel
    (setter("dflash_config", "conv_kernel_size", value=2), "conv_kernel_size"),
    (setter("dflash_config", "fc_layernorm", value=True), "fc_layernorm"),
    (setter("quantization_config", value={"quant_method": "fp8"}), "quantization_config"),
]


@pytest.mark.parametrize(
    "config, field", DFLASH_UNIMPLEMENTED, ids=[f for _, f in DFLASH_UNIMPLEMENTED]
)
def test_unimplemented_dflash_fields_are_refused_by_name(tmp_path, tinypy, config, field):
    d = copy_of(tmp_path, "tinypy-dflash", config)
    with pytest.raises(ConfigError) as error:
        load_dflash_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "config.json", field)


@pytest.mark.parametrize("name", ["tinypy-eagle3", "tinypy-dflash"])
def test_a_draft_with_a_modelopt_quantization_file_is_refused_naming_it(tmp_path, tinypy, name):
    """hf_quant_config.json beside a draft's config.json (ModelOpt's quantized export) declares it quantized, as a
    quantization_config does: refused naming the file, not loaded as plain layers."""
    from helpers.quantized_checkpoints import modelopt_config

    d = copy_of(tmp_path, name)
    (d / "hf_quant_config.json").write_text(json.dumps(modelopt_config()))
    load = load_eagle3_draft if name.endswith("eagle3") else load_dflash_draft
    with pytest.raises(ConfigError) as error:
        load(d, tinypy, torch.float32, "cpu")
    assert_names(error, d / "hf_quant_config.json", "drafts are not implemented")


def test_neutral_values_of_those_fields_load(tmp_path, tinypy):
    def eagle3(cfg):
        cfg.update(architectures=["Eagle3LlamaForCausalLM"], logit_scale=1.0)
        cfg["eagle_config"]["use_aux_hidden_state"] = True

    def dflash(cfg):
        cfg.update(is_causal=False, final_logit_softcapping=None, output_multiplier=1.0)
        cfg["dflash_config"]["input_embedding_scale"] = 1.0

    load_eagle3_draft(copy_of(tmp_path, "tinypy-eagle3", eagle3), tinypy, torch.float32, "cpu")
    load_dflash_draft(copy_of(tmp_path, "tinypy-dflash", dflash), tinypy, torch.float32, "cpu")


# ---- damaged weights: the file and the tensor named ------------------------------------------------------------


def retyped(name, dtype):
    return lambda t: t.__setitem__(name, t[name].to(dtype))


@pytest.mark.parametrize(
    "tensors, name",
    [
        (retyped("d2t", torch.float32), "d2t"),  # was truncated to integers and served
        (lambda t: t.__setitem__("d2t", t["d2t"].double() + 0.5), "d2t"),
        (retyped("t2d", torch.float16), "t2d"),
    ],
    ids=["d2t-float32", "d2t-float64-fractions", "t2d-float16"],
)
def test_token_maps_of_a_float_dtype_are_refused(tmp_path, tinyds, tensors, name):
    d = copy_of(tmp_path, "tinyds-eagle3", tensors=tensors)
    with pytest.raises(CheckpointError) as error:
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")
    assert_names(error, d / "model.safetensors", f"'{name}'", "dtype")


@pytest.mark.parametrize(
    "value, problem",
    [(10**6, "outside the target vocabulary"), (-(10**6), "outside the target vocabulary")],
    ids=["past-the-vocabulary", "negative"],
)
def test_d2t_out_of_range_names_its_file(tmp_path, tinyds, value, problem):
    d = copy_of(tmp_path, "tinyds-eagle3", tensors=lambda t: t["d2t"].__setitem__(7, value))
    with pytest.raises(DraftMismatchError) as error:
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")
    assert_names(error, d / "model.safetensors", "'d2t'", problem, "draft id 7")


def test_d2t_sending_two_draft_ids_to_one_target_id_names_its_file(tmp_path, tinyds):
    def collide(t):
        t["d2t"][1] = t["d2t"][0] - 1  # draft id 1 -> the target id of draft id 0

    d = copy_of(tmp_path, "tinyds-eagle3", tensors=collide)
    with pytest.raises(DraftMismatchError) as error:
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")
    assert_names(error, d / "model.safetensors", "'d2t'", "two draft ids to one target id")


def test_dflash_fc_of_the_wrong_rank_is_named(tmp_path, tinypy):
    """A 0-d fc.weight raised IndexError: tuple index out of range."""
    d = copy_of(
        tmp_path, "tinypy-dflash", tensors=lambda t: t.__setitem__("fc.weight", torch.ones(()))
    )
    with pytest.raises(DraftMismatchError) as error:
        load_dflash_draft(d, tinypy, torch.float32, "cpu")
    assert_names(error, "fc.weight", "has shape ()")


def drop(name):
    return lambda t: t.pop(name)


def shrink(name):
    return lambda t: t.__setitem__(name, t[name][:-1].contiguous())


def extra(t):
    t["midlayer.self_attn.extra.weight"] = torch.zeros(3)


DAMAGED = [  # (draft, tensor edit, the tensor named); every one was refused already: kept so it stays so
    ("tinyds-eagle3", drop("midlayer.mlp.up_proj.weight"), "midlayer.mlp.up_proj.weight"),
    ("tinyds-eagle3", shrink("midlayer.hidden_norm.weight"), "midlayer.hidden_norm.weight"),
    ("tinyds-eagle3", retyped("norm.weight", torch.int32), "norm.weight"),
    ("tinyds-eagle3", extra, "midlayer.self_attn.extra.weight"),
    ("tinyds-eagle3", shrink("t2d"), "t2d"),
    ("tinypy-dflash", drop("layers.3.mlp.down_proj.weight"), "layers.3.mlp.down_proj.weight"),
    ("tinypy-dflash", shrink("hidden_norm.weight"), "hidden_norm.weight"),
    ("tinypy-dflash", retyped("norm.weight", torch.bool), "norm.weight"),
    ("tinypy-dflash", extra, "midlayer.self_attn.extra.weight"),
    ("tinypy-draft", shrink("model.norm.weight"), "model.norm.weight"),
    ("tinypy-draft", retyped("model.layers.1.mlp.up_proj.weight", torch.int8), "up_proj"),
    ("tinypy-draft", extra, "midlayer.self_attn.extra.weight"),
]


@pytest.mark.parametrize("draft, tensors, name", DAMAGED, ids=[f"{d}-{n}" for d, _, n in DAMAGED])
def test_damaged_draft_weights_are_refused_before_serving(tmp_path, draft, tensors, name):
    method = {"tinyds-eagle3": "eagle3", "tinypy-dflash": "dflash", "tinypy-draft": "draft"}[draft]
    target = "tinyds" if draft == "tinyds-eagle3" else "tinypy"
    d = copy_of(tmp_path, draft, tensors=tensors)
    with pytest.raises(REFUSED) as error:
        LLM(str(ZOO / target), device="cpu", speculative=SpeculativeConfig(method, draft=str(d)))
    assert_names(error, d, name)


def test_a_float_d2t_is_refused_before_serving(tmp_path):
    d = copy_of(tmp_path, "tinyds-eagle3", tensors=retyped("d2t", torch.float32))
    with pytest.raises(CheckpointError) as error:
        LLM(
            str(ZOO / "tinyds"), device="cpu", speculative=SpeculativeConfig("eagle3", draft=str(d))
        )
    assert_names(error, d / "model.safetensors", "'d2t'")
