"""End to end through the engine, for every drafter: with temperature, top-k and top-p, the
distribution of the first three generated tokens equals the target's own (chi-square against the
exact joint computed from the target). A tiny vocabulary keeps the joint small enough to test."""

import pytest
import torch

from helpers.lossless_sampling import (
    LENGTH,
    PARAMS,
    PROMPT,
    SPECS,
    TRIALS,
    VOCAB,
    save_sampling_models,
)
from helpers.stats import chi_square_p_value, exact_joint
from outpace import LLM


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_sampling_models(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("method", list(SPECS))
def test_emitted_tokens_follow_the_target_distribution(method, models):
    llm = LLM(
        str(models["target"]),
        block_size=4,
        num_kv_blocks=4096,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        seed=123,
        speculative=SPECS[method](models),
    )
    if method.endswith("adaptive"):
        shapes, turn = llm.engine.runner.shapes, iter(range(10**6))
        for chooser in llm.engine.choosers.values():
            chooser.choose = lambda bucket, ids, remaining=None: shapes[next(turn) % len(shapes)]
    outs = llm.generate([PROMPT] * TRIALS, PARAMS)
    emitted = torch.tensor([o.token_ids for o in outs])  # [TRIALS, LENGTH]
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]
    counts = torch.bincount(index, minlength=VOCAB**LENGTH)
    p = chi_square_p_value(counts, TRIALS * exact_joint(models["target"], PROMPT, PARAMS, VOCAB))
    assert p > 1e-3, f"{method}: p = {p:.2e}"
    if method != "none":
        assert (
            sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0.1 * TRIALS
        )  # speculation really ran
