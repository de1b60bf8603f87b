"""Expert parallelism on a dense model (no routed experts) is refused by name, on CPU processes
(gloo): the engine started with outpace's own ranks raises on rank 0, and the rank it started stops
by itself, saying why (its own refusal, not a lost rank 0), instead of each rank running the whole
model for nothing."""

from __future__ import annotations

import pytest
import torch

from outpace import LLM
from outpace.distributed import launch
from outpace.validation import ConfigError

REFUSAL = r"EngineConfig.expert_parallel_size=2 is invalid: the model in .* has no routed experts"


def test_a_dense_model_is_refused_expert_parallelism_and_every_rank_stops(
    llama_dir, monkeypatch, capfd
):
    started = []
    real = launch._start_ranks

    def start_ranks(config):
        ranks = real(config)
        started.extend(ranks.processes.values())
        return ranks

    monkeypatch.setattr(launch, "_start_ranks", start_ranks)
    with pytest.raises(ConfigError, match=REFUSAL):
        LLM(str(llama_dir), device="cpu", expert_parallel_size=2)
    assert len(started) == 1 and started[0].exitcode == 1  # (exited, not terminated by rank 0)
    assert "outpace rank 1: stopping: ConfigError: EngineConfig.expert_parallel_size=2" in (
        capfd.readouterr().err
    )
    assert not torch.distributed.is_initialized()
