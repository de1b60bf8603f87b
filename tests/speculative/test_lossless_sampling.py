"""End to end through the engine, for every drafter: with temperature, top-k and top-p, the
distribution of the first three generated tokens equals the target's own (chi-square against the
exact joint computed from the target). A tiny vocabulary keeps the joint small enough to test."""
import pytest
import torch

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from helpers.spec_models import make_dflash_draft, make_eagle3_draft, random_llama
from helpers.stats import chi_square_p_value, exact_joint

VOCAB, PROMPT, LENGTH, TRIALS = 5, [0, 1, 2, 3, 4, 1], 3, 6000
PARAMS = SamplingParams(temperature=0.8, top_k=4, top_p=0.95, max_tokens=LENGTH, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target = random_llama(root / "target", VOCAB, seed=0, mtp_layers=2)
    return {"target": target, "draft": random_llama(root / "draft", VOCAB, seed=1),
            "eagle3": make_eagle3_draft(target, root / "eagle3", draft_vocab_size=4, aux_ids=[0, 1, 2]),
            "dflash": make_dflash_draft(target, root / "dflash", block_size=3, layer_ids=(0, 1), mask_token_id=4)}


SPECS = {
    "none": lambda m: SpeculativeConfig(),
    "eagle3-chain": lambda m: SpeculativeConfig("eagle3", str(m["eagle3"]), num_steps=3),
    "eagle3-tree": lambda m: SpeculativeConfig("eagle3", str(m["eagle3"]), num_steps=3, topk=2, num_draft_tokens=5),
    "mtp": lambda m: SpeculativeConfig("mtp", num_steps=2),
    "ngram": lambda m: SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    "draft": lambda m: SpeculativeConfig("draft", str(m["draft"]), num_steps=3),
    "dflash": lambda m: SpeculativeConfig("dflash", str(m["dflash"]), num_steps=2),
    # adaptive speculation, forced through 0 .. 3 drafts step after step (speculative/adaptive.py)
    "eagle3-adaptive": lambda m: SpeculativeConfig("eagle3", str(m["eagle3"]), num_steps=3, adaptive=True),
}


@pytest.mark.parametrize("method", list(SPECS))
def test_emitted_tokens_follow_the_target_distribution(method, models):
    llm = LLM(str(models["target"]), block_size=4, num_kv_blocks=4096, max_num_seqs=1024,
              max_num_batched_tokens=8192, seed=123, speculative=SPECS[method](models))
    if method.endswith("adaptive"):
        shapes, turn = llm.engine.runner.shapes, iter(range(10 ** 6))
        for chooser in llm.engine.runner.choosers.values():
            chooser.choose = lambda bucket, ids: shapes[next(turn) % len(shapes)]
    outs = llm.generate([PROMPT] * TRIALS, PARAMS)
    emitted = torch.tensor([o.token_ids for o in outs])  # [TRIALS, LENGTH]
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]
    counts = torch.bincount(index, minlength=VOCAB ** LENGTH)
    p = chi_square_p_value(counts, TRIALS * exact_joint(models["target"], PROMPT, PARAMS, VOCAB))
    assert p > 1e-3, f"{method}: p = {p:.2e}"
    if method != "none":
        assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0.1 * TRIALS  # speculation really ran
