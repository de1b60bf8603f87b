"""A decode step replayed for no request (``ModelRunner.probe_replays``: adaptive speculation's start-up
profile on the GPU, benchmarks' timelines). Its rows must route through a mixture as real requests' rows
would, or a MoE's deeper verifies and larger batches profile cheaper than they run; and it must leave no
trace: no request's state, KV block or output changes. On CUDA the engine's start-up profile replays its
captured steps so, and the test's replays too (the routing is checked on the CPU, where the step runs eagerly)."""

from pathlib import Path

import pytest
import torch

from outpace import LLM, SamplingParams
from outpace.cache.kv_cache import pool_cache_tensors
from outpace.config import SpeculativeConfig
from outpace.engine.step_key import SamplingMode, StepKey
from outpace.layers.moe import RoutedExperts
from outpace.speculative.proposer import DraftShape

ZOO = Path(__file__).resolve().parents[2] / "zoo"
BATCH, DRAFTS = 8, 3


def _engine(device: str) -> LLM:
    return LLM(
        str(ZOO / "tinyds"),
        speculative=SpeculativeConfig("mtp", num_steps=DRAFTS, adaptive=True),
        device=device,
        dtype="float32",
        max_num_seqs=BATCH,
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_probe_rows_route_apart_and_leave_no_trace(monkeypatch, device):
    llm, fresh = _engine(device), _engine(device)
    prompts = ["def add(a, b):", "import os\n"]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    llm.generate(prompts[:1], params)  # a finished request: its row is idle again
    runner = llm.engine.runner
    pool = llm.engine.scheduler.pool
    padding = pool.padding_block
    key = StepKey(BATCH, DraftShape(DRAFTS), SamplingMode.GREEDY)

    routed = []  # each verify forward's experts, one row per token: [rows, top_k]
    run = RoutedExperts.run

    def recording(self, x, weights, ids, *args, **kwargs):
        routed.append(ids.clone())
        return run(self, x, weights, ids, *args, **kwargs)

    monkeypatch.setattr(RoutedExperts, "run", recording)
    buffers_before = [t.clone() for t in runner.decode_step.state_buffers(key)]
    blocks_before = [
        t[torch.arange(t.shape[0], device=t.device) != padding].clone()
        for t in pool_cache_tensors(pool)
    ]
    with runner.probe_replays(key) as replay:
        for _ in range(2):
            replay()
    monkeypatch.undo()
    assert runner.profile(key) > 0  # (the start-up's profile on CUDA replays the same way)
    if device == "cpu":  # (on CUDA a captured step routes without calling ``run``)
        nodes = key.shape.num_nodes
        verify = [ids for ids in routed if ids.shape[0] == BATCH * nodes]
        assert verify, "no routed forward over the verify's rows"
        # node 0 of every row: on one shared padding row these were one token, routed alike
        first_nodes = {tuple(sorted(r)) for r in verify[0].view(BATCH, nodes, -1)[:, 0].tolist()}
        assert len(first_nodes) >= BATCH // 2, first_nodes

    for old, new in zip(buffers_before, runner.decode_step.state_buffers(key)):
        assert torch.equal(old, new)
    for old, t in zip(blocks_before, pool_cache_tensors(pool)):
        assert torch.equal(old, t[torch.arange(t.shape[0], device=t.device) != padding])
    # (the acceptance may differ: adaptive drafting learned from the first request)
    after, alone = llm.generate(prompts, params), fresh.generate(prompts, params)
    assert [o.token_ids for o in after] == [o.token_ids for o in alone]
