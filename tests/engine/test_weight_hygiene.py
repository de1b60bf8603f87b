"""Files that cannot be read are refused with an error that names the file and what is wrong, before
the model is built (issue 42 item 6, build item 3): empty or truncated safetensors files, a
pytorch_model.bin that is no archive, an index that is no valid JSON or names a missing shard, a
tokenizer file that is no valid JSON, for targets and draft checkpoints alike."""

import io
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from outpace.checkpoint import INDEX_FILE, CheckpointError
from outpace.config import EngineConfig
from outpace.engine.engine import LLMEngine
from outpace.models import loader
from outpace.models.drafts.dflash import tokenizer_mask_token_id
from outpace.models.loader import load_model
from outpace.speculative.drafters.draft_model import shared_vocab_size
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def copy_zoo(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ZOO / name, tmp_path / name))


# ---- files that cannot be read: named, before the model is built -------------------------------------


def write(file: Path, content: bytes) -> Path:
    file.write_bytes(content)
    return file


def truncated(file: Path, size: int) -> Path:
    return write(file, file.read_bytes()[:size])


def as_bin(path: Path, content: bytes) -> Path:
    """The checkpoint as a pytorch_model.bin holding ``content`` (its safetensors file removed)."""
    (path / "model.safetensors").unlink()
    return write(path / "pytorch_model.bin", content)


def as_indexed(path: Path, index: str | None = None) -> Path:
    """The checkpoint with a model.safetensors.index.json (``index``'s text, else a valid one)."""
    if index is None:
        names = load_file(path / "model.safetensors")
        index = json.dumps({"weight_map": dict.fromkeys(names, "model.safetensors")})
    (path / INDEX_FILE).write_text(index)
    return path / INDEX_FILE


def with_shard_missing(path: Path) -> Path:
    index = as_indexed(path)
    (path / "model.safetensors").unlink()
    return index


def zip_start(path: Path) -> bytes:
    """The first kilobytes of a real torch.save archive of the checkpoint: a zip without its end."""
    archive = io.BytesIO()
    torch.save(load_file(path / "model.safetensors"), archive)
    return archive.getvalue()[:4096]


ST = "model.safetensors"
UNREADABLE = {  # damage(checkpoint dir) -> the damaged file, and what the error says of it
    "empty safetensors": (
        lambda p: write(p / ST, b""),
        "is empty (0 bytes): not a safetensors file",
    ),
    "truncated safetensors": (
        lambda p: truncated(p / ST, 7_000_000),
        "is truncated: its tensors end at byte 15292576, the file has 7000000 bytes",
    ),
    "truncated header": (
        lambda p: truncated(p / ST, 100),
        "is truncated or not a safetensors file: its first 8 bytes give a header of",
    ),
    "garbage .bin": (lambda p: as_bin(p, b"not a pickle"), "is not a PyTorch archive"),
    "empty .bin": (lambda p: as_bin(p, b""), "is empty (0 bytes)"),
    "truncated .bin": (
        lambda p: as_bin(p, zip_start(p)),
        "is truncated: a zip archive without its end",
    ),
    "index not JSON": (lambda p: as_indexed(p, '{"weight_map": '), "not valid JSON"),
    "index a list": (lambda p: as_indexed(p, "[]"), "must hold a JSON object, got a list"),
    "weight_map a list": (
        lambda p: as_indexed(p, '{"weight_map": []}'),
        "field 'weight_map' must be an object of tensor name -> file name, got list",
    ),
    "missing shard": (with_shard_missing, "names shard(s) that are missing"),
}


@pytest.fixture
def no_model_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the files were checked")

    monkeypatch.setattr(loader, "build_model", refuse)


@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_weight_file_is_named_before_the_model_is_built(
    kind, tmp_path, no_model_built
):
    path = copy_zoo("tinypy", tmp_path)
    damage, problem = UNREADABLE[kind]
    file = damage(path)
    with pytest.raises(CheckpointError, match=re.escape(str(file)) + ".*" + re.escape(problem)):
        load_model(path, torch.float32, progress=False)


@pytest.mark.parametrize(
    "name", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
)
def test_a_tokenizer_file_that_is_no_json_is_named_before_the_model_loads(
    name, tmp_path, monkeypatch
):
    path = copy_zoo("tinypy", tmp_path)
    (path / name).write_text('{"truncated": ')

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the tokenizer was")

    monkeypatch.setattr("outpace.engine.engine.load_model", refuse)
    with pytest.raises(ConfigError, match=re.escape(f"{path / name}: not valid JSON")):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)


def test_a_tokenizer_transformers_cannot_load_names_its_directory(tmp_path):
    path = copy_zoo("tinypy", tmp_path)
    (path / "tokenizer.json").write_text("{}")
    with pytest.raises(
        ConfigError, match=re.escape(f"{path}: the tokenizer cannot be loaded by transformers")
    ):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)


def test_a_draft_tokenizer_file_that_is_no_json_is_named(tmp_path):
    """A draft model's tokenizer.json (compared with the target's) and the target's tokenizer files a
    DFlash draft reads its mask token from."""
    draft = copy_zoo("tinypy-draft", tmp_path)
    (draft / "tokenizer.json").write_text("{")
    with pytest.raises(ConfigError, match=re.escape(f"{draft / 'tokenizer.json'}: not valid JSON")):
        shared_vocab_size(ZOO / "tinypy", draft)
    target_dir = copy_zoo("tinypy", tmp_path)
    (target_dir / "tokenizer_config.json").write_text("{")
    with pytest.raises(
        ConfigError, match=re.escape(f"{target_dir / 'tokenizer_config.json'}: not valid JSON")
    ):
        tokenizer_mask_token_id(target_dir)
