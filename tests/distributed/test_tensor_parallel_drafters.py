"""The drafters that read a target's own layers or caches, at two ranks on DeepSeek and Gemma targets (CPU
processes, gloo, fp32): DeepSeek-V3's own MTP layer (one step, and reused over three), DFlash (its draft's heads
split, conditioned on the target's whole hidden features) and a standalone draft (the target itself, sharded as
the target is) on a DeepSeek-V3 target; DFlash and the standalone draft on a Gemma 3 target, whose embedding is
whole on every rank. Each gives the target's greedy tokens alone and accepts exactly as many drafts as at one
rank (small vocabularies, so random drafts are accepted now and then; the target as its own draft has every
draft accepted). MTP and DFlash also through a token map (speculative/hot_vocab.py: the split head gathered, its
rows of the map whole on every rank).

One group of 2 processes (tests/helpers/tp_harness.py) runs every scenario; the TP = 1 references run in the test
process.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from helpers.deepseek_models import SPEC_PROMPTS, save_v3_with_mtp
from helpers.gemma_models import make_splittable_gemma
from helpers.hf_models import save_hf_model
from helpers.spec_models import make_dflash_draft
from helpers.tp_harness import Scenario, run_group
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
VOCAB = 13
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16)


def dflash(target: Path, out: Path) -> SpeculativeConfig:
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    draft = make_dflash_draft(target, out, layer_ids=tuple(range(layers)), mask_token_id=VOCAB - 1)
    return SpeculativeConfig("dflash", str(draft), num_steps=3)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, tuple[str, SpeculativeConfig]]:
    """name -> (target directory, speculative config)."""
    root = tmp_path_factory.mktemp("drafters")
    deepseek = save_v3_with_mtp(root / "deepseek")[2]  # DeepSeek-V3 with one MTP layer
    gemma = save_hf_model(make_splittable_gemma("gemma3", vocab_size=VOCAB), root / "gemma3")
    token_map = root / "token_map.pt"
    torch.save([11, 0, 3, 5, 7, 1, 8, 2, 9], token_map)  # 9 of the 13 tokens
    with_map = dict(token_map=str(token_map))
    deepseek_dflash = dflash(deepseek, root / "deepseek-dflash")
    return {
        "deepseek-mtp-1": (str(deepseek), SpeculativeConfig("mtp", num_steps=1)),
        "deepseek-mtp-3": (str(deepseek), SpeculativeConfig("mtp", num_steps=3)),
        "deepseek-mtp-3-map": (str(deepseek), SpeculativeConfig("mtp", num_steps=3, **with_map)),
        "deepseek-dflash": (str(deepseek), deepseek_dflash),
        "deepseek-dflash-map": (str(deepseek), dataclasses.replace(deepseek_dflash, **with_map)),
        "deepseek-draft": (str(deepseek), SpeculativeConfig("draft", str(deepseek), num_steps=3)),
        "gemma3-dflash": (str(gemma), dflash(gemma, root / "gemma3-dflash")),
        "gemma3-draft": (str(gemma), SpeculativeConfig("draft", str(gemma), num_steps=3)),
    }


@pytest.fixture(scope="module")
def tp2(scenarios, tmp_path_factory) -> dict:
    return run_group(
        2,
        [
            Scenario(name, path, SPEC_PROMPTS, GREEDY, dict(ENGINE, speculative=spec))
            for name, (path, spec) in scenarios.items()
        ],
        tmp_path_factory.mktemp("tp2"),
    )


def one_rank(path: str, **engine) -> tuple[list[list[int]], int]:
    """TP = 1: the greedy tokens and the drafts accepted."""
    with LLM(path, **engine) as llm:
        outs = llm.generate(SPEC_PROMPTS, GREEDY)
    return [o.token_ids for o in outs], sum(o.spec_metrics.num_accepted_drafts for o in outs)


@pytest.mark.parametrize(
    "name",
    [
        "deepseek-mtp-1",
        "deepseek-mtp-3",
        "deepseek-mtp-3-map",
        "deepseek-dflash",
        "deepseek-dflash-map",
        "deepseek-draft",
        "gemma3-dflash",
        "gemma3-draft",
    ],
)
def test_drafter_at_two_ranks_is_lossless_with_one_ranks_acceptance(name, scenarios, tp2):
    path, spec = scenarios[name]
    got = tp2[name]
    assert got["tokens"] == one_rank(path, **ENGINE)[0]
    assert got["accepted"] == one_rank(path, **ENGINE, speculative=spec)[1] > 0
    assert got["free_blocks"] == ENGINE["num_kv_blocks"]
    if name.endswith(
        "-draft"
    ):  # the target as its own draft: every draft accepted but where max_tokens cut
        assert got["accepted"] >= 0.9 * 3 * got["verifies"]
