"""Adaptive speculation (speculative/adaptive.py): the number of drafts changes from step to step,
output stays lossless, and a drafter whose drafts are useless ends up not drafting at all."""
import json
from pathlib import Path

import pytest

from oracle_proposer import OracleProposer
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.registry import PROPOSERS
from outpace.speculative.adaptive import DraftLengthChooser
from outpace.speculative.proposer import DraftShape, draft_shapes

PROPOSERS["oracle"] = "oracle_proposer:OracleProposer"
ZOO = "zoo/tinypy"
EAGLE3 = SpeculativeConfig("eagle3", "zoo/tinypy-eagle3", num_steps=5, adaptive=True)


def _prompts(n: int) -> list[str]:
    return json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"][:n]


def test_config_is_adaptive_unless_the_shape_is_given():
    assert SpeculativeConfig("ngram").adaptive and SpeculativeConfig("ngram").num_steps == 5
    assert not SpeculativeConfig("ngram", num_steps=3).adaptive
    assert draft_shapes(SpeculativeConfig("ngram", num_steps=3)) == (DraftShape(3),)
    assert [s.num_steps for s in draft_shapes(SpeculativeConfig("ngram"))] == [0, 1, 2, 3, 4, 5]
    tree = SpeculativeConfig("eagle3", "d", num_steps=4, topk=2, num_draft_tokens=8, adaptive=True)
    assert draft_shapes(tree) == (DraftShape(0), DraftShape(4, 2, 8))


def test_chooser_takes_the_best_tokens_per_second():
    shapes = [DraftShape(k) for k in range(4)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k, cost in enumerate((1.0, 1.2, 1.4, 1.6)):
        chooser.record_cost(1, DraftShape(k), cost)
    for _ in range(200):  # drafts 1 and 2 always accepted, draft 3 never
        chooser.observe(DraftShape(3), [2])
    # E(k) = 1, 2, 3, 3 tokens for 1.0, 1.2, 1.4, 1.6: k = 2 is best
    assert [round(a, 2) for a in chooser.acceptance()] == [1.0, 1.0, 0.0]
    assert chooser.choose(1) == DraftShape(2)
    for _ in range(400):  # now nothing is accepted: plain decoding wins
        chooser.observe(DraftShape(3), [0])
    assert chooser.choose(1) == DraftShape(0)


def test_every_unknown_cost_is_tried_once_and_probes_refresh_acceptance():
    shapes = [DraftShape(k) for k in range(3)]
    chooser = DraftLengthChooser(shapes, probe_every=4)
    tried = []
    for _ in range(3):
        shape = chooser.choose(8)
        tried.append(shape)
        chooser.record_cost(8, shape, 1.0 + shape.num_steps)
    assert sorted(s.num_steps for s in tried) == [0, 1, 2]
    assert chooser.choose(8) == shapes[-1]  # the 4th step is a probe


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lossless_while_the_number_of_drafts_changes(temperature):
    """A chooser forced through every shape in turn: greedy output equals plain decoding, token for
    token; sampled requests run through every shape too (their distribution is checked against the
    target's, with the shapes changing, in test_lossless_sampling.py's eagle3-adaptive case)."""
    prompts = _prompts(4)
    params = SamplingParams(temperature=temperature, max_tokens=40, ignore_eos=True, seed=1)
    llm = LLM(ZOO, max_num_seqs=4, speculative=EAGLE3)
    shapes, turn = llm.engine.runner.shapes, iter(range(10 ** 6))
    for chooser in llm.engine.runner.choosers.values():
        chooser.choose = lambda bucket: shapes[next(turn) % len(shapes)]
    outs = llm.generate(prompts, params)
    seen = [n for o in outs for n, c in enumerate(o.spec_metrics.verifies_by_num_drafts) if c]
    assert set(seen) == {0, 1, 2, 3, 4, 5}
    assert all(len(o.token_ids) == 40 for o in outs)
    if temperature == 0:
        expected = LLM(ZOO, max_num_seqs=4).generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in expected]


def test_useless_drafts_are_not_drafted(monkeypatch):
    """An oracle whose every draft is wrong: after trying each shape, the steps draft nothing but the
    probes (one step in 64). The steps' costs are a fixed model here (each verified token adds a tenth
    of a step), so that the choice follows acceptance alone, not a busy CPU's timing noise."""
    record = DraftLengthChooser.record_cost
    monkeypatch.setattr(DraftLengthChooser, "record_cost",
                        lambda self, bucket, shape, seconds: record(self, bucket, shape, 1.0 + 0.1 * shape.num_nodes))
    prompts = _prompts(2)
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    expected = LLM(ZOO).generate(prompts, params)
    monkeypatch.setattr(OracleProposer, "corruption", 1.0)
    llm = LLM(ZOO, speculative=SpeculativeConfig("oracle", "unused", num_steps=4, adaptive=True))
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    by_drafts = outs[0].spec_metrics.verifies_by_num_drafts
    assert by_drafts[0] >= 0.9 * sum(by_drafts), by_drafts
