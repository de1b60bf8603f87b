"""A checkpoint's config.json is honoured as transformers reads it, or refused with an error that names
the file and the field (issue 42, items 2 and 6)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from helpers.hf_models import make_hf_model, paged_prefill_error, save_hf_model
from outpace.model_config import ModelConfig
from outpace.models.drafts.eagle3 import load_eagle3_draft
from outpace.models.loader import load_model
from outpace.validation import ConfigError


def rewrite_config(path, **changes):
    """Change fields of the checkpoint's config.json; returns transformers' model of the new file."""
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


# transformers 5 writes rope_parameters; our zoo's configs (and many on the Hub) keep a top-level
# rope_theta beside it. transformers reads the rope_parameters, falling back on rope_theta.
ROPE_LAYOUTS = {
    "linear factor 2": {
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    },
    "theta inside": {
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    },
    "theta outside": {"rope_theta": 500000.0, "rope_parameters": {"rope_type": "default"}},
}


@pytest.mark.parametrize("layout", list(ROPE_LAYOUTS))
def test_rope_parameters_beside_rope_theta_match_transformers(layout, tmp_path):
    path = save_hf_model(make_hf_model("llama"), tmp_path)
    hf = rewrite_config(path, **ROPE_LAYOUTS[layout])
    rel = paged_prefill_error(hf, path, hf.config.vocab_size)
    assert rel < 1e-4, f"{layout}: relative error {rel}"


def test_unimplemented_rope_type_in_rope_parameters_is_refused_beside_rope_theta():
    cfg = {**make_hf_model("llama").config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    for key in ("rope_parameters", "rope_scaling"):
        rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
        with pytest.raises(ConfigError, match="rope_type.*'dynamic'"):
            ModelConfig.from_dict({**cfg, "rope_theta": 10000.0, key: rope})


# ---- every field the loaders read is type-checked, the error naming the file and the field ----------

ZOO = Path(__file__).resolve().parents[2] / "zoo"


class Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()  # a field left out

# field -> a value of the wrong type or an absurd one (MISSING: the field left out)
BAD_FIELDS = [
    ("rms_norm_eps", "1e-5"),
    ("rms_norm_eps", True),
    ("hidden_size", MISSING),
    ("hidden_size", "256"),
    ("architectures", "LlamaForCausalLM"),
    ("architectures", [7]),
    ("vocab_size", 4096.0),
    ("max_position_embeddings", 1e9),
    ("max_position_embeddings", 10**9),
    ("head_dim", 0),
    ("head_dim", -32),
    ("num_key_value_heads", 0),
    ("num_hidden_layers", 6.0),
    ("num_attention_heads", True),
    ("intermediate_size", MISSING),
    ("tie_word_embeddings", "yes"),
    ("eos_token_id", "0"),
    ("eos_token_id", [0, 1.5]),
    ("hidden_act", 5),
    ("torch_dtype", 16),
    ("num_nextn_predict_layers", -1),
    ("num_nextn_predict_layers", "3"),
    ("chain_mtp_hidden_states", "true"),
    ("rope_parameters", "x"),
    ("attention_bias", "false"),
    ("mlp_bias", 1),
]


def zoo_copy(tmp_path, name="tinypy", **changes) -> Path:
    """zoo/<name>'s config.json in a directory of its own, with ``changes`` (MISSING deletes a field)."""
    cfg = json.loads((ZOO / name / "config.json").read_text())
    for key, value in changes.items():
        if value is MISSING:
            cfg.pop(key)
        else:
            cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def refused_naming(path, fn, *names) -> str:
    with pytest.raises(ConfigError) as err:
        fn()
    message = str(err.value)
    assert str(path) in message and all(n in message for n in names), message
    return message


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={v!r}"[:40] for f, v in BAD_FIELDS])
def test_a_bad_field_is_refused_naming_file_and_field(field, value, tmp_path):
    zoo_copy(tmp_path, **{field: value})
    refused_naming(
        tmp_path / "config.json", lambda: ModelConfig.from_pretrained(tmp_path), repr(field)
    )


def test_the_message_says_what_was_expected_and_what_came(tmp_path):
    zoo_copy(tmp_path, rms_norm_eps="1e-5")
    message = refused_naming(tmp_path, lambda: ModelConfig.from_pretrained(tmp_path))
    assert (
        message == f"{tmp_path / 'config.json'}: field 'rms_norm_eps' must be a number, got '1e-5'"
    )


def test_rope_theta_is_type_checked_where_transformers_reads_it(tmp_path):
    zoo_copy(tmp_path, rope_theta="abc", rope_parameters=None)
    refused_naming(tmp_path, lambda: ModelConfig.from_pretrained(tmp_path), "'rope_theta'", "'abc'")
    zoo_copy(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": "abc"})
    refused_naming(
        tmp_path, lambda: ModelConfig.from_pretrained(tmp_path), "'rope_parameters.rope_theta'"
    )


@pytest.mark.parametrize("text", ['{"architectures": [', "", "[1, 2]", '"LlamaForCausalLM"'])
def test_a_config_that_is_not_a_json_object_is_refused_naming_the_file(text, tmp_path):
    (tmp_path / "config.json").write_text(text)
    refused_naming(tmp_path / "config.json", lambda: ModelConfig.from_pretrained(tmp_path))


def test_a_config_dict_that_is_not_a_dict_is_refused():
    with pytest.raises(ConfigError, match="config.json: must hold a JSON object, got a list"):
        ModelConfig.from_dict([1, 2])


@pytest.mark.parametrize("ids", ["1,2,3", [1, "2", 3], [1.0, 2.0, 3.0], 3])
def test_eagle3_aux_layer_ids_of_another_type_are_refused_naming_file_and_field(ids, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(ZOO / "tinypy-eagle3", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (draft / "config.json").write_text(json.dumps(cfg))
    target = load_model(ZOO / "tinypy", torch.float32)
    refused_naming(
        draft / "config.json",
        lambda: load_eagle3_draft(draft, target, torch.float32, "cpu"),
        "'eagle_config.eagle_aux_hidden_state_layer_ids'",
    )


@pytest.mark.parametrize("head", ["own", "copy"])
def test_a_stored_head_beside_a_tied_embedding_is_refused_unless_a_copy(head, tmp_path):
    """tie_word_embeddings true with an lm_head.weight stored too: the stored head was dropped silently (so
    were its tokens, where it is a head of its own); a copy of the embedding, as some exporters write, loads."""
    from safetensors.torch import load_file, save_file

    from outpace.checkpoint import CheckpointError

    path = tmp_path / "tinypy"
    shutil.copytree(Path(__file__).resolve().parents[2] / "zoo" / "tinypy", path)
    tensors = load_file(path / "model.safetensors")
    embedding = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = embedding.clone() if head == "copy" else embedding.flip(0)
    save_file(tensors, path / "model.safetensors")
    if head == "copy":
        load_model(path, torch.float32)
        return
    message = (
        r"model\.safetensors: tensor 'lm_head\.weight' is a head of its own.*tie_word_embeddings"
    )
    with pytest.raises(CheckpointError, match=message):
        load_model(path, torch.float32)
