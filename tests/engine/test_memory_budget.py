"""KV pool sized from memory (engine/memory.py): the target's and the drafter's caches reallocated at the
chosen size, the choice reported, the cap, refusals naming the numbers; on a GPU, gpu_memory_utilization."""

from pathlib import Path

import pytest
import torch

from outpace import LLM, SamplingParams
from outpace.cache.kv_cache import pool_cache_tensors
from outpace.config import EngineConfig, SpeculativeConfig
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SMALL = dict(block_size=4, max_num_seqs=2, max_num_batched_tokens=32)


def every_cache(llm) -> list[torch.Tensor]:
    return pool_cache_tensors(llm.engine.pool)


def test_cpu_pool_sized_from_available_memory_with_the_drafter_counted(llama_dir, caplog):
    caplog.set_level("INFO", logger="outpace.engine")
    plain = LLM(str(llama_dir), cpu_memory_utilization=0.5, **SMALL)
    plan = plain.engine.memory_plan
    assert (
        plan is not None and plan.num_blocks == plan.limit == plain.engine.pool.num_blocks
    )  # capped
    max_pos = plain.engine.model_config.max_position_embeddings
    assert plan.limit == 2 * -(-max_pos // 4)  # max_num_seqs requests of the longest context
    assert all(t.shape[0] == plan.num_blocks + 1 for t in every_cache(plain))
    assert (
        "KV cache sized from cpu memory" in caplog.text
        and f"{plan.num_blocks} blocks of 4 tokens" in caplog.text
    )
    spec = LLM(
        str(llama_dir),
        cpu_memory_utilization=0.5,
        speculative=SpeculativeConfig("draft", str(llama_dir), num_steps=2),
        **SMALL,
    )
    # the draft's KV rows are part of a block's cost, and its caches were reallocated with the target's
    assert spec.engine.memory_plan.block_bytes == 2 * plan.block_bytes
    caches = every_cache(spec)
    assert len(caches) == 2 * len(every_cache(plain))
    assert all(t.shape[0] == spec.engine.pool.num_blocks + 1 for t in caches)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[(i * 11 + j) % 200 for j in range(5 + i)] for i in range(3)]
    assert [o.token_ids for o in spec.generate(prompts, params)] == [
        o.token_ids for o in plain.generate(prompts, params)
    ]


def test_an_earlier_peak_of_the_process_is_not_this_engines_workspace(llama_dir):
    """The CPU workspace is the peak RSS of the profiling prefill above the RSS before it: a larger peak reached
    earlier in the same process (another engine, a test worker's history) is not counted (engine/memory.py
    ``_reset_peak_rss``)."""
    big = torch.ones(
        384 << 20, dtype=torch.uint8
    )  # 384 MiB touched, then freed: the process's peak
    del big
    plan = LLM(str(llama_dir), cpu_memory_utilization=0.5, **SMALL).engine.memory_plan
    assert plan.workspace < 256 << 20, plan.summary(4)


def test_too_little_memory_is_refused_with_the_numbers(llama_dir):
    with pytest.raises(
        ConfigError,
        match=r"not enough memory for the KV cache: 0 blocks fit, one request needs "
        r"\d+ \(KV cache sized from cpu memory.*budget.*workspace.*\); raise "
        r"EngineConfig.cpu_memory_utilization",
    ):
        LLM(str(llama_dir), cpu_memory_utilization=1e-9, **SMALL)


def test_a_prompt_the_pool_can_never_hold_is_refused_naming_the_pool(llama_dir):
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=3)
    with pytest.raises(
        ValueError,
        match=r"prompt has 12 tokens, the context holds 12 \(set by the KV cache "
        r"\(3 blocks of 4\)\)",
    ):
        llm.generate([list(range(12))], SamplingParams(max_tokens=2))
    assert llm.engine.pool.num_free == 3 and not llm.engine.has_unfinished_requests


@pytest.mark.parametrize(
    "field,value",
    [
        ("gpu_memory_utilization", 0.0),
        ("gpu_memory_utilization", 1.5),
        ("cpu_memory_utilization", -1),
        ("cpu_memory_utilization", True),
        ("num_kv_blocks", 0),
        ("enable_prefix_caching", "yes"),
    ],
)
def test_bad_fields_are_refused_by_name(field, value):
    with pytest.raises(ConfigError, match=f"EngineConfig.{field}="):
        EngineConfig(model="x", **{field: value})


@pytest.mark.parametrize("field", ["gpu_memory_utilization", "cpu_memory_utilization"])
def test_a_utilization_beside_num_kv_blocks_is_refused_naming_both(field):
    with pytest.raises(
        ConfigError,
        match=rf"EngineConfig.num_kv_blocks=8 and EngineConfig.{field}=0.5 both size the KV pool: "
        r"give one",
    ):
        EngineConfig(model="x", num_kv_blocks=8, **{field: 0.5})


def test_a_utilization_for_the_other_device_is_refused_naming_both(monkeypatch):
    """Checked on the resolved device: 'auto' that means CUDA refuses cpu_memory_utilization too."""
    with pytest.raises(
        ConfigError,
        match=r"EngineConfig.gpu_memory_utilization=0.5 does not apply on device='cpu': .*"
        r"EngineConfig.cpu_memory_utilization",
    ):
        EngineConfig(model="x", device="cpu", gpu_memory_utilization=0.5)
    monkeypatch.setattr("outpace.config.default_device", lambda: "cuda")
    with pytest.raises(
        ConfigError,
        match=r"EngineConfig.cpu_memory_utilization=0.5 does not apply on device='cuda': .*"
        r"EngineConfig.gpu_memory_utilization",
    ):
        EngineConfig(model="x", cpu_memory_utilization=0.5)


def test_the_gpu_share_defaults_to_0_9_on_cuda_only(monkeypatch):
    cpu = EngineConfig(model="x")
    assert cpu.gpu_memory_utilization is None and not cpu.kv_blocks_from_memory
    assert EngineConfig(model="x", cpu_memory_utilization=0.5).memory_utilization == 0.5
    monkeypatch.setattr("outpace.config.default_device", lambda: "cuda")
    cuda = EngineConfig(model="x")
    assert cuda.memory_utilization == 0.9 and cuda.kv_blocks_from_memory
    assert EngineConfig(model="x", gpu_memory_utilization=0.5).memory_utilization == 0.5
    assert not EngineConfig(model="x", num_kv_blocks=8).kv_blocks_from_memory


def test_the_cpu_default_is_a_fixed_pool(llama_dir):
    llm = LLM(str(llama_dir))
    assert llm.engine.memory_plan is None and llm.engine.pool.num_blocks == 512


@pytest.mark.gpu
def test_gpu_pool_sized_from_gpu_memory_utilization(llama_dir):
    llm = LLM(
        str(llama_dir),
        device="cuda",
        gpu_memory_utilization=0.5,
        max_num_seqs=4,
        speculative=SpeculativeConfig("draft", str(llama_dir), num_steps=2),
    )
    plan = llm.engine.memory_plan
    total = torch.cuda.mem_get_info()[1]
    assert (
        plan.budget == int(total * 0.5)
        and plan.num_blocks > 0
        and plan.workspace > 0
        and plan.graphs > 0
    )
    assert all(t.shape[0] == plan.num_blocks + 1 for t in every_cache(llm))
    assert torch.cuda.memory_allocated() <= plan.budget
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert llm.generate([[1, 2, 3]], params)[0].token_ids
