"""Tensor parallelism over torch.distributed, on CPU processes (gloo), in fp32: the Llama family at
TP = 2 and TP = 3 (kv heads split, replicated, vocabulary padded past a rank's share) gives exactly the
TP = 1 greedy tokens with batching, chunked prefill and preemption; every drafter is lossless under
TP = 2; dimensions that do not split and a world size that does not match are refused by name; a rank
that dies stops the engine with an error naming it, and nothing hangs.

The groups of 2 and 3 processes are spawned once each (tests/helpers/tp_harness.py) and run every scenario;
the TP = 1 references run in the test process.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.tp_harness import Scenario, run_group
from outpace import LLM, SamplingParams
from outpace.checkpoint import load_checkpoint
from outpace.config import SpeculativeConfig
from outpace.distributed.group import RankGroup, building_in
from outpace.distributed.launch import RankFailure
from outpace.distributed.lockstep import DriverChoice, Lockstep, RankDivergence, StepMessage
from outpace.distributed.sharding import ShardingError, vocab_shard_rows
from outpace.model_config import ModelConfig
from outpace.models.llama import LlamaForCausalLM
from outpace.models.loader import build_model
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TARGET = str(ZOO / "tinypy")
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# a small pool and token budget: several requests batched, prompts chunked, requests preempted
PRESSURE = dict(block_size=4, num_kv_blocks=24, max_num_batched_tokens=16)
FAMILY = {  # variant -> kv heads at TP = 3 (6 query heads): 3 splits evenly, 1 is replicated on every rank
    "llama": 1,
    "mistral": 3,
    "qwen2": 1,
    "qwen3": 3,
}
DRAFTERS = {
    "eagle3-chain": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=4),
    "eagle3-tree": SpeculativeConfig(
        "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3, topk=2, num_draft_tokens=6
    ),
    "eagle3-adaptive": SpeculativeConfig(
        "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=4, adaptive=True
    ),
    "mtp": SpeculativeConfig("mtp", num_steps=3),
    "dflash": SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7),
    "draft": SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=3),
    "ngram": SpeculativeConfig("ngram", num_steps=3),
}
SAMPLED = SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=7)


def family_prompts() -> list[list[int]]:
    return [[(i * 37 + j * 11) % 203 for j in range(3 + 9 * i)] for i in range(5)]


def zoo_prompts() -> list[str]:
    return json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][16:20]


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict[str, dict[int, str]]:
    """variant -> {tensor_parallel_size: checkpoint}: the 6-head configs with 2 kv heads (TP = 2) and with
    the kv heads of FAMILY (TP = 3)."""
    root = tmp_path_factory.mktemp("family")
    return {
        v: {
            2: str(save_hf_model(make_hf_model(v), root / f"{v}-2")),
            3: str(save_hf_model(make_hf_model(v, num_key_value_heads=kv), root / f"{v}-3")),
        }
        for v, kv in FAMILY.items()
    }


def reference(model: str, prompts, params=GREEDY, **engine) -> list[list[int]]:
    with LLM(model, **engine) as llm:
        return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def tp2(family, tmp_path_factory) -> dict:
    scenarios = [Scenario(f"{v}", family[v][2], family_prompts(), GREEDY, PRESSURE) for v in FAMILY]
    scenarios += [
        Scenario(
            m,
            TARGET,
            zoo_prompts(),
            GREEDY,
            dict(num_kv_blocks=24, max_num_batched_tokens=64, speculative=spec),
        )
        for m, spec in DRAFTERS.items()
    ]
    scenarios.append(
        Scenario(
            "eagle3-sampled",
            TARGET,
            zoo_prompts(),
            SAMPLED,
            dict(speculative=DRAFTERS["eagle3-chain"]),
        )
    )
    return run_group(2, scenarios, tmp_path_factory.mktemp("tp2"), probes=[driver_choice_probe])


class _RankChooser:
    """A draft-length chooser that would choose differently on every rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def choose(self, bucket: int) -> str:
        return f"shape of rank {self.rank} for bucket {bucket}"


def driver_choice_probe(rank: int, world: int) -> list[str]:
    """Every rank's DriverChoice.choose (run on each rank of a spawned group)."""
    group = RankGroup(rank, world, torch.distributed.group.WORLD, torch.distributed.group.WORLD)
    mine = DriverChoice(_RankChooser(rank), group).choose(4)
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, mine)
    return everyone


@pytest.fixture(scope="module")
def tp3(family, tmp_path_factory) -> dict:
    scenarios = [Scenario(f"{v}", family[v][3], family_prompts(), GREEDY, PRESSURE) for v in FAMILY]
    scenarios.append(
        Scenario(
            "world-mismatch",
            family["llama"][3],
            [[1]],
            GREEDY,
            dict(tensor_parallel_size=2),
            error="do not match the process group's world size 3",
        )
    )
    return run_group(3, scenarios, tmp_path_factory.mktemp("tp3"))


@pytest.mark.parametrize("variant", list(FAMILY))
@pytest.mark.parametrize("size", [2, 3])
def test_llama_family_matches_one_rank(variant, size, family, request):
    got = request.getfixturevalue(f"tp{size}")[variant]
    assert got["tokens"] == reference(family[variant][size], family_prompts(), **PRESSURE)
    assert got["preemptions"] > 0
    assert got["free_blocks"] == PRESSURE["num_kv_blocks"]


@pytest.fixture(scope="module")
def zoo_reference() -> list[list[int]]:
    return reference(TARGET, zoo_prompts())


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_drafter_is_lossless_at_two_ranks(method, tp2, zoo_reference):
    got = tp2[method]
    assert got["tokens"] == zoo_reference
    assert got["verifies"] > 0 and got["accepted"] > 0
    assert got["preemptions"] > 0 and got["free_blocks"] == 24


def test_sampled_speculation_matches_one_rank(tp2):
    """The same seeded draws from the same distributions (fp32: equal up to rounding) at both sizes."""
    spec = DRAFTERS["eagle3-chain"]
    assert tp2["eagle3-sampled"]["tokens"] == reference(
        TARGET, zoo_prompts(), SAMPLED, speculative=spec
    )


def test_every_rank_takes_rank_zeros_draft_length(tp2):
    assert tp2["driver_choice_probe"] == ["shape of rank 0 for bucket 4"] * 2


def test_a_rank_that_schedules_differently_fails_by_name():
    class Batch:  # a ScheduledRequest's fields that a schedule compares
        def __init__(self, rid, n):
            self.request, self.num_new_tokens = type("R", (), {"request_id": rid})(), n

    message = StepMessage(schedule=[("req-0", 16)])
    Lockstep(RankGroup(1, 2)).check([Batch("req-0", 16)], message)
    with pytest.raises(
        RankDivergence, match=r"rank 1 scheduled \[\('req-0', 8\)\], rank 0 scheduled"
    ):
        Lockstep(RankGroup(1, 2)).check([Batch("req-0", 8)], message)


def test_world_size_mismatch_is_refused(tp3):
    error = tp3["world-mismatch"]["error"]
    assert (
        "2 ranks (the larger of tensor_parallel_size and expert_parallel_size) do not match"
        in error
    )


def test_shards_cover_the_checkpoint(family):
    """Each rank loads only its slices; put back together they are the checkpoint (vocabulary padded
    with zero rows, kv heads replicated where there are fewer than ranks)."""
    path = family["llama"][3]
    cfg = ModelConfig.from_pretrained(path)
    whole = build_model(cfg, torch.float32)
    load_checkpoint(whole, path, progress=False)
    shards = []
    for rank in range(3):
        with building_in(RankGroup(rank, 3)):
            shards.append(build_model(cfg, torch.float32))
        load_checkpoint(shards[-1], path, progress=False)
    layer = [s.model.layers[0].self_attn for s in shards]
    assert torch.equal(
        torch.cat([a.q_proj.weight for a in layer]), whole.model.layers[0].self_attn.q_proj.weight
    )
    assert torch.equal(
        torch.cat([a.o_proj.weight for a in layer], 1),
        whole.model.layers[0].self_attn.o_proj.weight,
    )
    for a in layer:  # one kv head, replicated
        assert torch.equal(a.k_proj.weight, whole.model.layers[0].self_attn.k_proj.weight)
    assert (
        vocab_shard_rows(cfg.vocab_size, 3) == 128
    )  # 203 / 3 rounded up to 64 rows: rank 2 holds padding only
    embed = torch.cat([s.model.embed_tokens.weight for s in shards])
    assert torch.equal(embed[: cfg.vocab_size], whole.model.embed_tokens.weight)
    assert not embed[cfg.vocab_size :].any()


def test_dimensions_that_do_not_split_are_refused(family, monkeypatch):
    cfg = ModelConfig.from_pretrained(family["llama"][2])  # 6 heads, 2 kv heads, intermediate 96
    with building_in(RankGroup(0, 3)), pytest.raises(ShardingError, match="num_key_value_heads=2"):
        build_model(cfg, torch.float32)
    with building_in(RankGroup(0, 4)), pytest.raises(ShardingError, match="num_attention_heads=6"):
        build_model(cfg, torch.float32)
    monkeypatch.setattr(
        LlamaForCausalLM, "shards_over_ranks", False
    )  # (every registered class declares it)
    with (
        building_in(RankGroup(0, 2)),
        pytest.raises(ConfigError, match=f"{cfg.architecture} cannot be sharded"),
    ):
        build_model(cfg, torch.float32)


def test_a_rank_that_dies_stops_the_engine(zoo_reference):
    """Ranks started by outpace itself (spawned): killing rank 1 makes the next step fail on rank 0,
    naming the rank, within seconds; rank 0 then refuses to step and the group is gone."""
    llm = LLM(TARGET, tensor_parallel_size=2)
    try:
        assert [o.token_ids for o in llm.generate(zoo_prompts()[:1], GREEDY)] == zoo_reference[:1]
        worker = llm.engine.ranks.processes[1]
        os.kill(worker.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RankFailure, match="rank 1 exited with signal SIGKILL"):
            llm.generate(zoo_prompts()[:1], GREEDY)
        assert time.monotonic() - start < 30
        with pytest.raises(RuntimeError, match="engine stopped"):
            llm.engine.step()
        assert not torch.distributed.is_initialized()
    finally:
        llm.close()


RANK_ZERO_DIES = """
import os, signal, sys
from outpace import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(sys.argv[1], tensor_parallel_size=2)
    llm.generate(["def f("], SamplingParams(temperature=0, max_tokens=4))
    print(llm.engine.ranks.processes[1].pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _running(pid: int) -> bool:
    try:
        return "\\nState:\\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_ranks_stop_when_rank_zero_dies(tmp_path):
    """Rank 0 killed between steps: the rank it started sees the connection close and exits, naming why."""
    import subprocess
    import sys

    script = tmp_path / "rank_zero_dies.py"
    script.write_text(RANK_ZERO_DIES)
    done = subprocess.run(
        [sys.executable, str(script), TARGET], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL
    worker = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 20
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(worker)
    assert "outpace rank 1: stopping" in done.stderr
