"""A ``max_num_seqs`` whose per-sequence rows cannot fit in memory is refused naming it and the numbers, before
anything is allocated for them (engine/memory.py ``refuse_too_many_seqs``): before the weights load for the
block-table rows, once the target is built for a hybrid's recurrent state. Before, LLM(max_num_seqs=10**9) ran
into the allocator (on the CPU the OOM killer ended the process). A large batch that fits still starts."""

from __future__ import annotations

import re

import pytest
import torch

from outpace import LLM
from outpace.config import EngineConfig, SpeculativeConfig
from outpace.engine import memory
from outpace.engine.memory import SequenceRows, refuse_too_many_seqs
from outpace.engine.start_up import check_before_loading
from outpace.model_config import ModelConfig
from outpace.validation import ConfigError

ZOO = "zoo/tinypy"  # 2048 positions: a block-table row of 128 blocks of 16
HYBRID = "zoo/tinyqwen35"
MiB = 1 << 20


@pytest.fixture
def ram(monkeypatch):
    """The RAM available, as the engine reads it, set by the test."""

    def set_ram(num_bytes: int) -> None:
        monkeypatch.setattr(memory, "_available_ram", lambda: num_bytes)

    return set_ram


def test_block_tables_past_the_ram_are_refused_before_the_weights_load(ram, monkeypatch):
    ram(64 * MiB)
    monkeypatch.setattr(
        "outpace.engine.start_up.load_model", lambda *a, **k: pytest.fail("weights loaded")
    )
    with pytest.raises(ConfigError) as refused:
        LLM(ZOO, device="cpu", max_num_seqs=100_000)
    message = str(refused.value)
    assert re.match(
        r"EngineConfig.max_num_seqs=100000 is invalid: the engine allocates a block-table row of 128 "
        r"blocks for each sequence at start-up, 2.1 KiB a sequence, 206.9 MiB for 100001 rows \(one "
        r"for padding\), more than the RAM available \(64.0 MiB\): at most \d+ sequences fit$",
        message,
    ), message
    # the count it names is the bound: that many pass the check, one more does not
    most = int(re.search(r"at most (\d+) sequences fit", message).group(1))
    model_config = ModelConfig.from_pretrained(ZOO)
    check_before_loading(EngineConfig(model=ZOO, device="cpu", max_num_seqs=most), model_config)
    with pytest.raises(ConfigError, match=f"max_num_seqs={most + 1} is invalid"):
        check_before_loading(
            EngineConfig(model=ZOO, device="cpu", max_num_seqs=most + 1), model_config
        )


def test_a_hybrids_recurrent_state_past_the_ram_is_refused_before_it_is_allocated(ram):
    """The block tables of 2000 sequences fit in 100 MiB, their recurrent state (tinyqwen35's) does not."""
    ram(100 * MiB)
    with pytest.raises(
        ConfigError,
        match=r"EngineConfig.max_num_seqs=2000 is invalid: the engine allocates a block-table row of "
        r"\d+ blocks and [\d.]+ KiB of recurrent state for each sequence at start-up, .* more than "
        r"the RAM available \(100.0 MiB\): at most \d+ sequences fit",
    ):
        LLM(HYBRID, device="cpu", max_num_seqs=2000)


def test_the_drafters_rows_count_once_it_is_built(ram, monkeypatch):
    """An n-gram drafter keeps each sequence's tokens ((2048 + 4) int64: 16.0 KiB, eight block-table rows): 3000
    sequences' block tables fit in 32 MiB, with their histories they do not. Refused once the drafter is built,
    before the request table is allocated; the count it names starts, one more does not."""
    ram(32 * MiB)
    spec = SpeculativeConfig("ngram", num_steps=3)
    with pytest.raises(ConfigError) as refused:
        LLM(ZOO, device="cpu", max_num_seqs=3000, speculative=spec)
    message = str(refused.value)
    assert re.match(
        r"EngineConfig.max_num_seqs=3000 is invalid: the engine allocates a block-table row of 129 blocks "
        r"and 16.0 KiB of the drafter's rows for each sequence at start-up, 18.2 KiB a sequence, 53.2 MiB "
        r"for 3001 rows \(one for padding\), more than the RAM available \(32.0 MiB\): at most \d+ "
        r"sequences fit$",
        message,
    ), message
    most = int(re.search(r"at most (\d+) sequences fit", message).group(1))
    llm = LLM(ZOO, device="cpu", max_num_seqs=most, speculative=spec)
    assert llm.generate([[1, 2, 3]])[0].token_ids
    llm.close()
    monkeypatch.setattr(
        "outpace.engine.runner.RequestTable", lambda *a, **k: pytest.fail("request table built")
    )
    with pytest.raises(ConfigError, match=f"max_num_seqs={most + 1} is invalid"):
        LLM(ZOO, device="cpu", max_num_seqs=most + 1, speculative=spec)


def cuda_config(max_num_seqs: int) -> EngineConfig:
    """A config whose device reads CUDA, built without a GPU (only the budget's arithmetic runs)."""
    config = EngineConfig(model=ZOO, device="cpu", max_num_seqs=max_num_seqs)
    object.__setattr__(config, "device", "cuda")
    return config


def test_on_cuda_the_device_rows_are_held_to_the_gpu_share(ram, monkeypatch):
    """On CUDA the device's rows must fit in gpu_memory_utilization of the GPU (0.9 of 1 GiB here), the host's
    copies in the RAM available."""
    ram(1 << 40)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 1 << 30))
    with pytest.raises(
        ConfigError,
        match=r"max_num_seqs=1000000 is invalid: .* 1.0 GiB for 1000001 rows \(one for padding\), "
        r"more than gpu_memory_utilization=0.9 of the GPU's 1.0 GiB \(921.6 MiB\)",
    ):
        refuse_too_many_seqs(cuda_config(1_000_000), SequenceRows(table_blocks=128))
    refuse_too_many_seqs(cuda_config(800_000), SequenceRows(table_blocks=128))


def test_a_large_batch_that_fits_starts():
    """No cap below what memory holds: 4096 sequences of tinypy start on the CPU and serve."""
    llm = LLM(ZOO, device="cpu", max_num_seqs=4096)
    assert llm.engine.scheduler.max_num_seqs == 4096
    assert llm.generate([[1, 2, 3]])[0].token_ids
