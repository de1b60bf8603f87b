"""tau and per-position acceptance count only drafts that could have been committed under max_tokens."""

from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.speculative.metrics import SpecMetrics

ZOO = Path(__file__).resolve().parents[2] / "zoo"
PROMPT = "def parse_args(argv):\n    parser = argparse.ArgumentParser("


def test_record_caps_at_the_budget():
    m = SpecMetrics()
    m.record(5, 5, 5, budget=3)  # 3 tokens left: drafts 0 and 1 (+ the bonus) could be committed
    assert (m.num_draft_tokens, m.num_accepted_drafts) == (2, 2)
    assert m.accepted_per_position == [1, 1] and m.proposed_per_position == [1, 1]
    assert m.acceptance_length == 3.0
    m.record(5, 5, 1, budget=10)  # not capped
    assert m.proposed_per_position == [2, 2, 1, 1, 1] and m.accepted_per_position == [2, 1, 0, 0, 0]
    assert m.acceptance_rate_per_position == [1.0, 0.5, 0.0, 0.0, 0.0]
    tree = SpecMetrics()
    tree.record(9, 4, 3, budget=3, draft_depths=[1, 1, 2, 2, 2, 3, 3, 4, 4])
    assert (tree.num_draft_tokens, tree.num_accepted_drafts) == (5, 2)


@pytest.mark.parametrize("topk", [1, 2])
def test_tau_counts_no_draft_past_max_tokens(topk):
    spec = SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5, topk=topk)
    llm = LLM(str(ZOO / "tinypy"), device="cpu", speculative=spec)
    for max_tokens in (2, 5, 12):
        out = llm.generate(
            PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        )[0]
        m = out.spec_metrics
        assert len(out.token_ids) == max_tokens and m.num_verifies > 0
        # the first token comes from the prefill, every later one from a verify
        assert m.num_accepted_drafts + m.num_verifies == max_tokens - 1
        assert m.acceptance_length == (max_tokens - 1) / m.num_verifies
        assert sum(m.accepted_per_position) == m.num_accepted_drafts
        assert all(a <= p for a, p in zip(m.accepted_per_position, m.proposed_per_position))
        assert len(m.proposed_per_position) <= max_tokens - 2  # no draft at depth >= max_tokens - 1
        assert m.num_draft_tokens >= m.num_accepted_drafts
