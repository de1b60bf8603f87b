"""Rejection sampling stays exact at two ranks: with temperature, top-k and top-p, the first three tokens a
TP = 2 engine emits follow the target's own joint distribution (chi-square against the exact joint computed
from the unsharded target: tests/helpers/lossless_sampling.py's model, prompt and parameters), without drafts and
through EAGLE3 chains and trees, the target's MTP layers, DFlash and a standalone draft; each rank samples
from the logits gathered over the vocabulary shards (5 tokens, padded to 64 rows per rank). On a hybrid target
(Qwen3-Next: tests/helpers/hybrid_sampling.py's model, prompt and parameters) through EAGLE3 one draft deep,
so that a third token often comes from a second verify reading the recurrent state (each rank's heads) the
first kept.

One group of 2 processes (tests/helpers/tp_harness.py) runs every scenario.
"""

from __future__ import annotations

import pytest
import torch

from helpers import hybrid_sampling as hybrid
from helpers.hybrid_models import make_hybrid, save_hybrid
from helpers.lossless_sampling import PARAMS, PROMPT, SPECS, TRIALS, VOCAB, save_sampling_models
from helpers.spec_models import make_eagle3_draft
from helpers.stats import chi_square_p_value, exact_joint
from helpers.tp_harness import Scenario, run_group
from outpace.config import SpeculativeConfig

METHODS = ["none", "eagle3-chain", "eagle3-tree", "mtp", "dflash", "draft"]
HYBRID_SHAPES = {"chain": dict(num_steps=1), "tree": dict(num_steps=1, topk=3, num_draft_tokens=4)}
ENGINE = dict(
    block_size=4, num_kv_blocks=4096, max_num_seqs=1024, max_num_batched_tokens=8192, seed=123
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_sampling_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def hybrid_target(tmp_path_factory):
    """(Qwen3-Next of hybrid.VOCAB tokens, its EAGLE3 draft)."""
    root = tmp_path_factory.mktemp("hybrid")
    path = save_hybrid(make_hybrid("qwen3_next", vocab_size=hybrid.VOCAB), root / "target")
    return path, make_eagle3_draft(path, root / "eagle3")


@pytest.fixture(scope="module")
def tp2(models, hybrid_target, tmp_path_factory) -> dict:
    target = str(models["target"])
    scenarios = [
        Scenario(m, target, [PROMPT] * TRIALS, PARAMS, dict(ENGINE, speculative=SPECS[m](models)))
        for m in METHODS
    ]
    path, draft = hybrid_target
    scenarios += [
        Scenario(
            f"hybrid-{shape}",
            str(path),
            [hybrid.PROMPT] * hybrid.TRIALS,
            hybrid.SAMPLED,
            dict(ENGINE, speculative=SpeculativeConfig("eagle3", str(draft), **fields)),
        )
        for shape, fields in HYBRID_SHAPES.items()
    ]
    return run_group(2, scenarios, tmp_path_factory.mktemp("tp2"), timeout_s=900)


@pytest.fixture(scope="module")
def joint(models) -> torch.Tensor:
    return exact_joint(models["target"], PROMPT, PARAMS, VOCAB)


def p_value(tokens: list[list[int]], vocab: int, trials: int, joint: torch.Tensor) -> float:
    """Chi-square p-value of the first three tokens of ``trials`` outputs against ``joint`` [vocab ** 3]."""
    emitted = torch.tensor(tokens)  # [trials, 3]
    assert emitted.shape == (trials, 3)
    index = (emitted[:, 0] * vocab + emitted[:, 1]) * vocab + emitted[:, 2]
    return chi_square_p_value(torch.bincount(index, minlength=vocab**3), trials * joint)


@pytest.mark.parametrize("method", METHODS)
def test_sampled_tokens_at_two_ranks_follow_the_target_distribution(method, tp2, joint):
    got = tp2[method]
    p = p_value(got["tokens"], VOCAB, TRIALS, joint)
    assert p > 1e-3, f"{method}: p = {p:.2e}"
    if method != "none":
        assert got["accepted"] > 0.1 * TRIALS  # speculation really ran


@pytest.mark.parametrize("shape", list(HYBRID_SHAPES))
def test_sampled_tokens_on_a_hybrid_at_two_ranks_follow_the_target_distribution(
    shape, tp2, hybrid_target
):
    got = tp2[f"hybrid-{shape}"]
    p = p_value(
        got["tokens"],
        hybrid.VOCAB,
        hybrid.TRIALS,
        exact_joint(hybrid_target[0], hybrid.PROMPT, hybrid.SAMPLED, hybrid.VOCAB),
    )
    assert p > 1e-3, f"{shape}: p = {p:.2e}"
    assert got["accepted"] > 0.1 * hybrid.TRIALS  # speculation really ran
