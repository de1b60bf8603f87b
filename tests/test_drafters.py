"""Every drafter is lossless on the zoo target (greedy, fp32): mixed batches, chunked prefill and
preemption; misuse is refused at start-up; the MTP chain matters for acceptance."""
import json
import shutil
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import ConfigError, SpeculativeConfig
from outpace.spec.metrics import SpecMetrics
from outpace.train.corpus import build_corpus, heldout_prompts

ZOO = Path(__file__).resolve().parents[1] / "zoo"
TARGET = str(ZOO / "tinypy")
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
DRAFTERS = {
    "mtp": SpeculativeConfig("mtp", num_steps=3),
    "ngram": SpeculativeConfig("ngram", num_steps=4),
    "draft": SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=4),
}


@pytest.fixture(scope="module")
def zoo_reference():
    prompts = heldout_prompts(build_corpus(), 6, prompt_chars=240, seed=11)
    outs = LLM(TARGET).generate(prompts, GREEDY)
    return prompts, [o.token_ids for o in outs]


def merged(outs) -> SpecMetrics:
    m = SpecMetrics()
    for o in outs:
        m = m.merge(o.spec_metrics)
    return m


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
        llm.engine.spec_runner.proposer.chained = chained
        outs = llm.generate(prompts, GREEDY)
        assert [o.token_ids for o in outs] == expected  # lossless either way
        taus[chained] = merged(outs).acceptance_length
    assert taus[True] > taus[False] + 0.4, taus


def test_misuse_is_refused(tmp_path, llama_dir):
    with pytest.raises(ConfigError, match="num_nextn_predict_layers = 0"):
        LLM(str(llama_dir), speculative=SpeculativeConfig("mtp", num_steps=2))
    with pytest.raises(ConfigError, match="at most 3 steps"):
        LLM(TARGET, speculative=SpeculativeConfig("mtp", num_steps=4))
    other = shutil.copytree(ZOO / "tinypy-draft", tmp_path / "other-tokenizer")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError, match="different tokenizer"):
        LLM(TARGET, speculative=SpeculativeConfig("draft", str(other)))
    with pytest.raises(ConfigError, match="vocab_size"):
        LLM(TARGET, speculative=SpeculativeConfig("draft", str(llama_dir)))
