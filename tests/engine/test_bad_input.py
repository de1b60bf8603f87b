"""Bad input gets a clear error naming the problem, and the engine keeps serving."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.hf_models import make_hf_model, save_hf_model
from outpace import LLM, SamplingParams
from outpace.checkpoint import CheckpointError
from outpace.config import EngineConfig
from outpace.validation import ConfigError, RequestFieldError

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_missing_shard(tmp_path):
    path = save_hf_model(make_hf_model("llama"), tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[1].unlink()
    with pytest.raises(CheckpointError, match=shards[1].name):
        LLM(str(path))


def test_sharded_checkpoint_loads(tmp_path, llama_dir):
    path = save_hf_model(make_hf_model("llama"), tmp_path / "sharded", max_shard_size="40KB")
    p = [1, 2, 3, 4]
    assert (
        LLM(str(path)).generate([p], GREEDY)[0].token_ids
        == LLM(str(llama_dir)).generate([p], GREEDY)[0].token_ids
    )


def _rewrite(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_wrong_shape_missing_and_extra_tensor(tmp_path, llama_dir):
    name = "model.layers.1.mlp.up_proj.weight"
    bad = _rewrite(llama_dir, tmp_path / "shape", lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(CheckpointError, match=rf"{name}.*model.safetensors.*shape"):
        LLM(str(bad))
    missing = _rewrite(llama_dir, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"lacks.*{name}"):
        LLM(str(missing))
    extra = _rewrite(
        llama_dir, tmp_path / "extra", lambda t: t.__setitem__("model.bogus.weight", torch.zeros(2))
    )
    with pytest.raises(CheckpointError, match=r"model\.bogus\.weight.*model.safetensors"):
        LLM(str(extra))


def test_unknown_architecture(tmp_path, llama_dir):
    path = shutil.copytree(llama_dir, tmp_path / "arch")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="GPTNeoXForCausalLM"):
        LLM(str(path))


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 2.0),
        ("max_tokens", 0),
        ("seed", -2),
        ("stop", [""]),
    ],
)
def test_invalid_sampling_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


def test_invalid_engine_values_name_the_field():
    with pytest.raises(ConfigError, match="EngineConfig.block_size="):
        EngineConfig(model="x", block_size=0)
    for sizes in ((), (0, 4), (4, 8), (2.5,)):  # max_num_seqs is 4
        with pytest.raises(ConfigError, match=r"EngineConfig.cuda_graph_sizes=.*max_num_seqs=4"):
            EngineConfig(model="x", max_num_seqs=4, cuda_graph_sizes=sizes)
    assert EngineConfig(model="x", max_num_seqs=4, cuda_graph_sizes=[4, 1, 4]).cuda_graph_sizes == (
        1,
        4,
    )
    with pytest.raises(ConfigError, match="EngineConfig.speculative='eagle3'"):
        EngineConfig(model="x", speculative="eagle3")
    assert not EngineConfig(model="x", speculative=None).speculative.enabled  # vLLM's None
    # (a TypeError from pathlib before)
    with pytest.raises(ConfigError, match="EngineConfig.model=None"):
        EngineConfig(model=None)


def test_bad_prompts_leave_other_requests_unharmed(llama_dir):
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=32)
    engine = llm.engine
    good = [5, 6, 7]
    expected = llm.generate([good], GREEDY)[0].token_ids
    rid = engine.add_request(good, GREEDY)
    engine.step()
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="context holds 128"):
        engine.add_request([1] * 500, GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 10_000], GREEDY)
    with pytest.raises(ValueError, match="no tokenizer"):
        engine.add_request("text prompt", GREEDY)
    with pytest.raises(ValueError, match="^prompt 1: prompt is empty"):  # (which of several)
        llm.generate([good, []], GREEDY)
    with pytest.raises(RequestFieldError, match="^prompt 0: ") as refused:
        llm.generate([good, good], [SamplingParams(max_tokens=10**6), GREEDY])
    assert refused.value.field == "max_tokens"
    done = []
    while engine.has_unfinished_requests:
        done += engine.step()
    assert [o.request_id for o in done] == [rid] and done[0].token_ids == expected
    assert engine.pool.num_free == 32
