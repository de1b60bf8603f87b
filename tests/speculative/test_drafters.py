"""Every drafter is lossless on the zoo target (greedy, fp32): mixed batches, chunked prefill and
preemption; misuse is refused at start-up; the MTP chain matters for acceptance."""

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers.spec_models import random_llama
from helpers.zoo_drafters import zoo_drafters
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.speculative.metrics import SpecMetrics
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TARGET = str(ZOO / "tinypy")
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
DRAFTERS = zoo_drafters(chain_steps=5, tree=(4, 3, 10))


@pytest.fixture(scope="module")
def zoo_reference():
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][16:22]
    outs = LLM(TARGET).generate(prompts, GREEDY)
    return prompts, [o.token_ids for o in outs]


def merged(outs) -> SpecMetrics:
    return SpecMetrics.total(o.spec_metrics for o in outs)


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_drafter_is_lossless_on_zoo_with_preemption(method, zoo_reference):
    prompts, expected = zoo_reference
    llm = LLM(TARGET, num_kv_blocks=24, max_num_batched_tokens=64, speculative=DRAFTERS[method])
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert llm.engine.pool.num_free == 24
    assert merged(outs).num_verifies > 0


def test_mtp_chain_beats_feeding_every_layer_the_target_state(zoo_reference):
    """The bug the chain form exists to avoid: every MTP layer fed the target's hidden state."""
    prompts, expected = zoo_reference
    taus = {}
    for chained in (True, False):
        llm = LLM(TARGET, speculative=DRAFTERS["mtp"])
        llm.engine.proposer.chained = chained
        outs = llm.generate(prompts, GREEDY)
        assert [o.token_ids for o in outs] == expected  # lossless either way
        taus[chained] = merged(outs).acceptance_length
    assert taus[True] > taus[False] + 0.4, taus


def test_misuse_is_refused(tmp_path, llama_dir):
    with pytest.raises(ConfigError, match="num_nextn_predict_layers = 0"):
        LLM(str(llama_dir), speculative=SpeculativeConfig("mtp", num_steps=2))
    other = shutil.copytree(ZOO / "tinypy-draft", tmp_path / "other-tokenizer")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(
        ConfigError,
        match=re.escape(f"{other / 'tokenizer.json'}: the draft model does not fit the target: ")
        + ".* field 'model.vocab' gives",
    ):
        LLM(TARGET, speculative=SpeculativeConfig("draft", str(other)))
    with pytest.raises(ConfigError, match="vocab_size"):
        LLM(TARGET, speculative=SpeculativeConfig("draft", str(llama_dir)))


@pytest.fixture(scope="module")
def random_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("random")
    return {
        "mtp3": random_llama(root / "mtp3", 300, seed=0, mtp_layers=3, chained=True),
        "mtp1": random_llama(root / "mtp1", 300, seed=1, mtp_layers=1),
        "mtp2-flat": random_llama(root / "mtp2", 300, seed=2, mtp_layers=2, chained=False),
        "draft": random_llama(root / "draft", 300, seed=3),
    }


@pytest.mark.parametrize(
    "target,spec",
    [
        ("mtp3", SpeculativeConfig("mtp", num_steps=3)),
        ("mtp1", SpeculativeConfig("mtp", num_steps=4)),  # one MTP layer reused for 4 steps
        ("mtp3", SpeculativeConfig("mtp", num_steps=5)),  # the last of 3 layers goes on for 2 steps
        ("mtp2-flat", SpeculativeConfig("mtp", num_steps=2)),  # non-chained form from the config
        ("mtp3", SpeculativeConfig("ngram", num_steps=3, ngram_min=1)),
        ("mtp3", SpeculativeConfig("draft", "DRAFT", num_steps=3)),
    ],
)
def test_drafters_are_lossless_on_random_models(random_models, target, spec):
    if spec.method == "draft":
        spec = SpeculativeConfig("draft", str(random_models["draft"]), num_steps=3)
    path = str(random_models[target])
    prompts = [[(i * 37 + j * 11) % 300 for j in range(3 + 7 * i)] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = [o.token_ids for o in LLM(path, block_size=4).generate(prompts, params)]
    llm = LLM(path, block_size=4, num_kv_blocks=30, max_num_batched_tokens=20, speculative=spec)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert llm.engine.pool.num_free == 30


def test_spec_metrics_total_is_the_fieldwise_sum():
    a, b = SpecMetrics(), SpecMetrics()
    a.record(num_drafts=3, max_depth=3, num_accepted=2)
    b.record(num_drafts=1, max_depth=1, num_accepted=0)
    b.record(num_drafts=3, max_depth=3, num_accepted=3)
    t = SpecMetrics.total([a, b])
    assert (t.num_verifies, t.num_draft_tokens, t.num_accepted_drafts) == (3, 7, 5)
    assert t.accepted_per_position == [2, 2, 1] and t.proposed_per_position == [3, 2, 2]
    assert t.histogram == [1, 0, 1, 1] and t.verifies_by_num_drafts == [0, 1, 0, 2]
    assert SpecMetrics.total([]) == SpecMetrics()
