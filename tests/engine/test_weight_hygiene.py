"""Corrupt weights and unreadable files are refused with an error that names the file (and the tensor),
for targets and draft checkpoints alike (issue 42 items 5 and 6, build item 3): NaN or inf values and
integer or bool tensors where the model expects floating point (once loaded silently: the engine then
emitted token 0 with a NaN logprob); empty or truncated safetensors files, a pytorch_model.bin that is
no archive, an index that is no valid JSON or names a missing shard, a tokenizer file that is no valid
JSON, each before the model is built."""

import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from outpace.checkpoint import INDEX_FILE, CheckpointError, load_checkpoint
from outpace.config import EngineConfig, SpeculativeConfig
from outpace.distributed.group import RankGroup, building_in
from outpace.engine.engine import LLMEngine
from outpace.model_config import ModelConfig
from outpace.models import loader
from outpace.models.drafts.dflash import load_dflash_draft, tokenizer_mask_token_id
from outpace.models.drafts.eagle3 import load_eagle3_draft
from outpace.models.loader import build_model, load_model
from outpace.speculative.drafters.draft_model import shared_vocab_size
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
UP = "model.layers.0.mlp.up_proj.weight"
NAN, INF = math.nan, math.inf


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

    monkeypatch.setattr("outpace.engine.start_up.load_model", refuse)
    with pytest.raises(ConfigError, match=re.escape(f"{path / name}: not valid JSON")):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)


def test_a_tokenizer_transformers_cannot_load_names_its_directory(tmp_path):
    path = copy_zoo("tinypy", tmp_path)
    (path / "tokenizer.json").write_text("{}")
    with pytest.raises(
        ConfigError, match=re.escape(f"{path}: the tokenizer cannot be loaded by transformers")
    ):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)


BAD_TEMPLATE = "{% for m in messages %}{{ m['content'] }}"  # (no endfor)


@pytest.mark.parametrize(
    "file, value, named",
    [
        ("tokenizer_config.json", 5, "tokenizer_config.json: field 'chat_template' must be"),
        (
            "tokenizer_config.json",
            [{"template": "x"}],  # (transformers: a KeyError 'name')
            "tokenizer_config.json: field 'chat_template' must be",
        ),
        (
            "tokenizer_config.json",
            BAD_TEMPLATE,
            "tokenizer_config.json: field 'chat_template' is not a valid chat template (line 1)",
        ),
        (
            "tokenizer_config.json",
            [{"name": "default", "template": "x"}, {"name": "tool_use", "template": BAD_TEMPLATE}],
            "tokenizer_config.json: field 'chat_template' (the template named 'tool_use') is not a valid",
        ),
        ("chat_template.jinja", BAD_TEMPLATE, "chat_template.jinja is not a valid chat template"),
        (
            "additional_chat_templates/tool_use.jinja",
            BAD_TEMPLATE,
            "additional_chat_templates/tool_use.jinja is not a valid chat template",
        ),
    ],
    ids=["number", "unnamed", "syntax", "named-syntax", "jinja-file", "additional"],
)
def test_a_chat_template_that_cannot_render_is_named_before_the_model_loads(
    file, value, named, tmp_path, monkeypatch
):
    """A chat template of the wrong shape, or one that does not parse, failed each chat with a 400 blaming the
    request's messages (or transformers' KeyError 'name' at start-up), naming no file."""
    path = copy_zoo("tinypy", tmp_path)
    if file == "tokenizer_config.json":
        config = json.loads((path / file).read_text())
        (path / file).write_text(json.dumps({**config, "chat_template": value}))
    else:
        (path / file).parent.mkdir(exist_ok=True)
        (path / file).write_text(value)

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the tokenizer was")

    monkeypatch.setattr("outpace.engine.start_up.load_model", refuse)
    with pytest.raises(ConfigError, match=re.escape(f"{path}/{named}")):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)


def test_a_broken_tokenizer_link_and_a_tokenizer_directory_without_one_are_named(tmp_path):
    """The zoo's tokenizer.json files are symbolic links: a copy without ``cp -L`` keeps them broken, which read as
    "no tokenizer"; and ``EngineConfig.tokenizer`` naming a directory without one was taken as the model having
    none (found by fuzzing the loader)."""
    path = tmp_path / "tinyds"
    shutil.copytree(ZOO / "tinyds", path, symlinks=True)
    assert (path / "tokenizer.json").is_symlink() and not (path / "tokenizer.json").exists()
    with pytest.raises(
        ConfigError, match=re.escape(f"{path / 'tokenizer.json'} is a broken symbolic link")
    ):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)
    with pytest.raises(ConfigError, match=re.escape(f"EngineConfig.tokenizer={str(tmp_path)!r}")):
        LLMEngine(
            EngineConfig(model=str(ZOO / "tinypy"), tokenizer=str(tmp_path), device="cpu"),
            progress=False,
        )


def test_generation_config_eos_ids_end_a_request_too(tmp_path):
    """transformers' generate and vLLM stop on generation_config.json's eos_token_id as well as config.json's (an
    instruct model's end of turn may be listed there alone); it was never read (found by fuzzing the loader). An
    id it gives that is not an integer is named with the file."""
    from outpace import LLM, SamplingParams

    path = copy_zoo("tinypy", tmp_path)
    params = SamplingParams(temperature=0, max_tokens=8)
    plain = LLM(str(path), device="cpu").generate([[5, 6, 7]], params)[0].token_ids
    stop = next(t for t in plain[2:] if t not in plain[:2])  # a token first sampled third or later
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, stop]}))
    out = LLM(str(path), device="cpu").generate([[5, 6, 7]], params)[0]
    assert out.token_ids == plain[: plain.index(stop) + 1] and out.finish_reason == "stop"
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["x"]}))
    with pytest.raises(ConfigError, match=re.escape(f"{path / 'generation_config.json'}")):
        LLMEngine(EngineConfig(model=str(path), device="cpu"), progress=False)


def test_a_kv_cache_that_does_not_fit_memory_names_the_pool(monkeypatch):
    """--num-kv-blocks 100000000 failed inside torch's allocator (found by fuzzing the loader): the allocation's
    failure, here injected, names the pool's size and the fields to change."""
    from outpace.attention.layer import Attention

    def no_memory(self, *args):
        raise RuntimeError(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 819 GB"
        )

    monkeypatch.setattr(Attention, "bind_cache", no_memory)
    config = EngineConfig(model=str(ZOO / "tinypy"), device="cpu", num_kv_blocks=4096)
    with pytest.raises(
        ConfigError, match="KV cache of 4096 blocks of .* EngineConfig.num_kv_blocks"
    ):
        LLMEngine(config, progress=False)


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


# ---- corrupt weights: refused naming the file and the tensor ----------------------------------------


def rewrite_tensor(model_dir: Path, name: str, change) -> Path:
    """Replace tensor ``name`` of ``model_dir``'s model.safetensors by ``change(tensor)``; the file."""
    file = model_dir / "model.safetensors"
    tensors = load_file(file)
    tensors[name] = change(tensors[name])
    save_file(tensors, file, metadata={"format": "pt"})
    return file


def with_values(*values: float, dtype: torch.dtype | None = None):
    """A change that sets a tensor's first values (converting it to ``dtype`` first when given)."""

    def change(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(dtype or tensor.dtype).clone()
        tensor.view(-1)[: len(values)] = torch.tensor(values)
        return tensor

    return change


CORRUPT_WEIGHTS = {
    "NaN": (with_values(NAN, NAN, NAN), "has 3 NaN values"),
    "inf": (with_values(INF, -INF), "has 2 inf values"),
    "NaN and inf": (with_values(NAN, INF), "has 1 NaN value and 1 inf value"),
    "int32": (
        lambda t: t.to(torch.int32),
        "has dtype int32, the model expects floating point (float32)",
    ),
    "bool": (lambda t: t > 0, "has dtype bool, the model expects floating point (float32)"),
}


@pytest.mark.parametrize("kind", CORRUPT_WEIGHTS)
def test_a_corrupt_weight_is_refused_naming_the_file_and_the_tensor(kind, tmp_path):
    path = copy_zoo("tinypy", tmp_path)
    change, problem = CORRUPT_WEIGHTS[kind]
    file = rewrite_tensor(path, UP, change)
    with pytest.raises(CheckpointError, match=re.escape(f"{file}: tensor {UP!r} {problem}")):
        load_model(path, torch.float32, progress=False)


def test_a_nan_in_a_block_fp8_weight_is_named(tmp_path):
    """A NaN byte of a float8 weight (stored as a quantized checkpoint ships it) is counted as any other: torch
    has no isinf for float8 types, and the count raised NotImplementedError (found by fuzzing the loader)."""
    from helpers.quantized_checkpoints import block_fp8_config, is_projection, write_quantized

    path, _ = write_quantized(
        copy_zoo("tinypy", tmp_path / "src"),
        tmp_path,
        "fp8_block",
        is_projection,
        block_fp8_config(),
    )
    file = rewrite_tensor(path, UP, with_values(NAN))
    with pytest.raises(CheckpointError, match=re.escape(f"{file}: tensor {UP!r} has 1 NaN value")):
        load_model(path, torch.float32, progress=False)


def test_every_non_finite_tensor_is_counted(tmp_path):
    path = copy_zoo("tinypy", tmp_path)
    rewrite_tensor(path, UP, with_values(NAN))
    rewrite_tensor(path, "model.norm.weight", with_values(-INF))
    with pytest.raises(
        CheckpointError, match=r"\(and 1 more tensor\(s\) not finite: model.norm.weight\)"
    ):
        load_model(path, torch.float32, progress=False)


def test_values_that_overflow_the_loaded_dtype_are_named_so(tmp_path):
    path = copy_zoo("tinypy", tmp_path)
    file = rewrite_tensor(path, UP, with_values(1e6, -1e6, dtype=torch.float32))
    load_model(path, torch.float32, progress=False)  # finite as float32
    with pytest.raises(
        CheckpointError,
        match=re.escape(
            f"{file}: tensor {UP!r} has 2 inf values once converted to float16: its float32 values are finite"
        ),
    ):
        load_model(path, torch.float16, progress=False)


def test_finite_values_whose_float32_sum_overflows_load(tmp_path):
    """The fast check (a float32 sum per tensor) flags them; the exact count clears them."""
    path = copy_zoo("tinypy", tmp_path)
    rewrite_tensor(path, UP, with_values(3e38, 3e38, dtype=torch.float32))
    model = load_model(path, torch.float32, progress=False)
    assert max(p.max() for p in model.parameters()) == 3e38


def rank_model(path: Path, rank: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Rank ``rank`` of 2's shard of the model at ``path``, loaded (tensor parallelism)."""
    with building_in(RankGroup(rank, 2)):
        model = build_model(ModelConfig.from_pretrained(path), dtype)
    load_checkpoint(model, path, progress=False)
    return model


def test_each_rank_checks_the_slices_it_loads(tmp_path):
    """q_proj's rows split over 2 ranks: a NaN in rank 1's rows fails rank 1's load alone; an
    overflow there is told from the stored slice, read again."""
    path = copy_zoo("tinypy", tmp_path)
    name = "model.layers.0.self_attn.q_proj.weight"  # [256, 256]: rank 1 holds rows 128 ..
    nan_in_rank_1 = torch.zeros(256, 256)
    nan_in_rank_1[200, 3] = NAN
    file = rewrite_tensor(path, name, lambda t: t + nan_in_rank_1.to(t.dtype))
    rank_model(path, 0)
    with pytest.raises(
        CheckpointError, match=re.escape(f"{file}: tensor {name!r} has 1 NaN value")
    ):
        rank_model(path, 1)
    rewrite_tensor(path, name, lambda t: t.float().nan_to_num(nan=1e6))
    rank_model(path, 0, torch.float16)
    with pytest.raises(CheckpointError, match="has 1 inf value once converted to float16"):
        rank_model(path, 1, torch.float16)


class PackedWeight(nn.Module):
    """A parameter whose checkpoint form is int8 (as a quantization method would declare it)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 4))
        self.weight.checkpoint_dtypes = (torch.int8,)


def test_a_parameter_declares_the_dtypes_its_checkpoint_may_store(tmp_path):
    model = PackedWeight()
    save_file(
        {"weight": torch.arange(8, dtype=torch.int8).view(2, 4)}, tmp_path / "model.safetensors"
    )
    load_checkpoint(model, tmp_path, progress=False)
    assert model.weight.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    save_file({"weight": torch.ones(2, 4)}, tmp_path / "model.safetensors")
    with pytest.raises(
        CheckpointError, match="'weight' has dtype float32, the model expects one of int8"
    ):
        load_checkpoint(model, tmp_path, progress=False)


# ---- draft checkpoints: the same checks through the same function -------------------------------------


@pytest.fixture(scope="module")
def target():
    return load_model(ZOO / "tinypy", torch.float32, progress=False)


DRAFTS = {  # drafter -> (zoo checkpoint, one of its floating-point tensors, load(draft dir, target))
    "eagle3": (
        "tinypy-eagle3",
        "fc.weight",
        lambda d, t: load_eagle3_draft(d, t, torch.float32, "cpu"),
    ),
    "dflash": (
        "tinypy-dflash",
        "fc.weight",
        lambda d, t: load_dflash_draft(d, t, torch.float32, "cpu"),
    ),
    "draft_model": ("tinypy-draft", UP, lambda d, t: load_model(d, torch.float32, progress=False)),
    # MTP drafts with the target's own layers, stored after its decoder layers
    "mtp": (
        "tinypy",
        "model.layers.6.mlp.up_proj.weight",
        lambda d, t: load_model(d, torch.float32, progress=False),
    ),
}


@pytest.mark.parametrize("drafter", DRAFTS)
def test_a_draft_checkpoint_gets_the_same_checks(drafter, target, tmp_path):
    name, tensor, load = DRAFTS[drafter]
    path = copy_zoo(name, tmp_path)
    file = rewrite_tensor(path, tensor, with_values(INF))
    with pytest.raises(
        CheckpointError, match=re.escape(f"{file}: tensor {tensor!r} has 1 inf value")
    ):
        load(path, target)
    rewrite_tensor(path, tensor, lambda t: t.to(torch.int32))
    with pytest.raises(
        CheckpointError, match=re.escape(f"{file}: tensor {tensor!r} has dtype int32")
    ):
        load(path, target)
    truncated(file, 1000)
    with pytest.raises(CheckpointError, match=re.escape(f"{file}: is truncated")):
        load(path, target)


@pytest.mark.parametrize("drafter", ["eagle3", "dflash", "draft_model"])
def test_a_damaged_draft_is_named_before_the_target_loads(drafter, tmp_path, monkeypatch):
    """The offline API and the server check a draft checkpoint's files before loading the target (once the
    damage was found only after the target, which can take minutes at real size, had loaded)."""
    name, tensor, _ = DRAFTS[drafter]
    path = copy_zoo(name, tmp_path)
    file = truncated(rewrite_tensor(path, tensor, lambda t: t), 1000)

    def refuse(*args, **kwargs):
        raise AssertionError("the target loaded before the draft's files were checked")

    monkeypatch.setattr("outpace.engine.start_up.load_model", refuse)
    method = {"draft_model": "draft"}.get(drafter, drafter)
    config = EngineConfig(str(ZOO / "tinypy"), speculative=SpeculativeConfig(method, str(path)))
    with pytest.raises(CheckpointError, match=re.escape(f"{file}: is truncated")):
        LLMEngine(config, progress=False)
