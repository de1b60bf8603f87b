"""A draft that does not fit its target is refused naming the file (config.json, tokenizer.json, the weight file)
and the field it contradicts, where these errors once named only a directory: a standalone draft model's vocabulary
and tokenizer (speculative/drafters/draft_model.py ``shared_vocab_size``), a checkpoint without the drafter's tensor
(speculative/proposer.py ``draft_checkpoint_problem``), a DFlash block against num_steps, a target without MTP
layers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from outpace import LLM
from outpace.checkpoint import INDEX_FILE
from outpace.config import SpeculativeConfig
from outpace.speculative.drafters.draft_model import shared_vocab_size
from outpace.speculative.drafters.eagle3 import Eagle3Proposer
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TARGET = ZOO / "tinypy"


def copy_zoo(name: str, tmp_path: Path, config=None) -> Path:
    """A copy of zoo/``name`` whose config.json dict ``config`` edits in place."""
    out = shutil.copytree(ZOO / name, tmp_path / name)
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def tokenizer_size(directory: Path) -> int:
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    ids = [*tokenizer["model"]["vocab"].values(), *(t["id"] for t in tokenizer["added_tokens"])]
    return max(ids) + 1


def test_a_draft_vocab_size_without_tokenizers_names_both_config_files(tmp_path):
    """It said "draft <directory> has vocab_size ...": the draft's config.json and its field are named, with the
    target's config.json and the tokenizer.json that is missing."""
    draft = copy_zoo("tinypy-draft", tmp_path, lambda c: c.update(vocab_size=4000))
    (draft / "tokenizer.json").unlink()
    with pytest.raises(ConfigError) as error:
        shared_vocab_size(TARGET, draft)
    message = str(error.value)
    assert message.startswith(
        f"{draft / 'config.json'}: the draft model does not fit the target: vocab_size 4000 != "
        f"target vocab_size 4096 ({TARGET / 'config.json'})"
    ), message
    assert f"without {draft / 'tokenizer.json'} their tokenizers cannot be compared" in message


@pytest.mark.parametrize("field", ["model.vocab", "added_tokens"])
def test_a_draft_tokenizer_that_differs_names_the_file_field_and_token(field, tmp_path):
    """It said "draft <directory> has a different tokenizer": the draft's tokenizer.json is named, with the field
    that gives the first token the two disagree on, its ids, and how many tokens differ."""
    draft = copy_zoo("tinypy-draft", tmp_path)
    path = draft / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    if field == "model.vocab":  # two tokens' ids swapped
        vocab = tokenizer["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[300:302]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        token, ids, tail = b, (300, 301), " (2 tokens differ)"  # (the first by id)
    else:  # one special token moved past every id
        added = tokenizer["added_tokens"][0]
        token, old = added["content"], added["id"]
        added["id"] = tokenizer_size(draft) + 5
        ids, tail = (added["id"], old), ""
    path.write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError) as error:
        shared_vocab_size(TARGET, draft)
    assert str(error.value) == (
        f"{path}: the draft model does not fit the target: its tokenizer differs from the target's "
        f"{TARGET / 'tokenizer.json'}: field {field!r} gives {token!r} id {ids[0]}, the target's id "
        f"{ids[1]}{tail}"
    )


def test_a_draft_vocab_size_short_of_the_tokenizer_names_its_config(tmp_path):
    """It said "the tokenizer of <target directory> has ids up to ...": the draft's config.json and vocab_size are
    named, with the ids its embedding lacks and the tokenizer.json that has them."""
    size = tokenizer_size(TARGET)
    draft = copy_zoo("tinypy-draft", tmp_path, lambda c: c.update(vocab_size=size - 2))
    with pytest.raises(ConfigError) as error:
        shared_vocab_size(TARGET, draft)
    assert str(error.value) == (
        f"{draft / 'config.json'}: the draft model does not fit the target: vocab_size {size - 2} "
        f"leaves no embedding row for ids {size - 2} .. {size - 1} of {draft / 'tokenizer.json'}"
    )


def test_a_target_given_as_eagle3_draft_names_its_weight_file(tmp_path):
    """It said "it has no fc.weight tensor": the weight file is named, or for a sharded checkpoint its index."""
    problem = Eagle3Proposer.draft_checkpoint_problem(TARGET)
    assert problem.startswith(f"{TARGET / 'model.safetensors'} has no fc.weight tensor"), problem
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(TARGET / "config.json", sharded / "config.json")
    tensors = load_file(TARGET / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, sharded / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (sharded / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    problem = Eagle3Proposer.draft_checkpoint_problem(sharded)
    assert problem.startswith(f"{sharded / INDEX_FILE} has no fc.weight tensor"), problem


@pytest.mark.parametrize("field", ["dflash_config.block_size", "block_size"])
def test_num_steps_against_a_dflash_block_names_the_config_and_field(field, tmp_path):
    """It said "the DFlash draft <directory>: its block_size is 8": config.json and the field giving it are named."""

    def edit(cfg):
        if field == "block_size":  # given at the top level only
            cfg["dflash_config"].pop("block_size")

    draft = copy_zoo("tinypy-dflash", tmp_path, edit)
    spec = SpeculativeConfig("dflash", str(draft), num_steps=3)
    with pytest.raises(ConfigError) as error:
        LLM(str(TARGET), device="cpu", speculative=spec)
    assert str(error.value) == (
        f"SpeculativeConfig.num_steps=3 is invalid for the DFlash draft: {draft / 'config.json'}: "
        f"{field} is 8, and num_steps + 1 (= 4) must equal block_size; use num_steps=7"
    )


def test_mtp_on_a_target_without_mtp_layers_names_its_config():
    """It said "<architecture> checkpoint has num_nextn_predict_layers = 0": the target's config.json is named."""
    target = ZOO / "tinygemma"
    with pytest.raises(ConfigError) as error:
        LLM(str(target), device="cpu", speculative=SpeculativeConfig("mtp", num_steps=2))
    assert str(error.value).endswith(
        f": {target / 'config.json'}: the Gemma3ForCausalLM checkpoint has "
        "num_nextn_predict_layers = 0"
    ), str(error.value)
    assert "needs a target with MTP layers" in str(error.value)


def test_mtp_counted_but_absent_names_the_config_and_weight_file(tmp_path):
    """A DeepSeek-V3 config.json that counts MTP layers its tensors lack (as transformers' save_pretrained writes
    them): the config.json and the weight file are named."""
    target = copy_zoo("tinyds", tmp_path)
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    tensors = load_file(target / "model.safetensors")
    mtp = tuple(f"model.layers.{i}." for i in range(layers, layers + 2))
    save_file(
        {n: t for n, t in tensors.items() if not n.startswith(mtp)}, target / "model.safetensors"
    )
    with pytest.raises(ConfigError) as error:
        LLM(str(target), device="cpu", speculative=SpeculativeConfig("mtp", num_steps=2))
    assert str(error.value).endswith(
        f": {target / 'config.json'}: the DeepseekV3ForCausalLM checkpoint counts "
        "num_nextn_predict_layers = 2 but its tensors hold no MTP layer in that architecture's "
        f"layout ({target / 'model.safetensors'})"
    ), str(error.value)
