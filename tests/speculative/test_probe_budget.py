"""Probes within a time budget (speculative/adaptive.py ``probe_budget``): where a probe costs several zero-draft
steps (at batch 32 on the H200 one costs 1.5 to 2.5), a drafter whose drafts are never accepted spends at most the
engine's ``PROBE_BUDGET`` of its steps' time in probes; where probes are cheap they still come every
``probe_every`` steps. The steps' costs are a fixed model here, not timed."""

import pytest

from outpace.config import EngineConfig, SpeculativeConfig
from outpace.engine.engine import LLMEngine
from outpace.engine.step_key import SamplingMode
from outpace.speculative.adaptive import PROBE_BUDGET

ZOO = "zoo/tinypy"
STEPS = 3000


@pytest.mark.parametrize("longest", [2.5, 1.3])
def test_the_engines_probes_spend_at_most_the_budget(longest):
    """The engine's chooser, drafts never accepted and a probe (one draft past plain decoding's) costing
    ``longest`` zero-draft steps: the probes' extra time stays within the budget (at 2.5: a probe in 150 steps,
    not in 64), and cheap probes come every 64 steps."""
    spec = SpeculativeConfig("ngram", num_steps=4, adaptive=True)
    engine = LLMEngine(
        EngineConfig(model=ZOO, device="cpu", dtype="float32", speculative=spec), progress=False
    )
    chooser = engine.choosers[SamplingMode.GREEDY]
    costs = {
        s: longest + 0.05 * (s.num_steps - 1) if s.num_steps else 1.0 for s in engine.runner.shapes
    }
    for shape, cost in costs.items():
        chooser.record_cost(32, shape, cost)
    spent = probes = 0.0
    for step in range(
        -STEPS // 4, STEPS
    ):  # (the first steps: until the chooser has seen no draft accepted)
        shape = chooser.choose(32, ("a", "b"))
        chooser.observe(shape, [0, 0], ("a", "b"))
        if step >= 0:
            spent += costs[shape]
            probes += shape.num_steps > 0
    assert (
        probes and (spent - STEPS) / STEPS <= PROBE_BUDGET
    )  # the probes' extra, in zero-draft steps
    if longest - 1.0 <= PROBE_BUDGET * chooser.probe_every:
        assert abs(probes - STEPS / chooser.probe_every) <= 1
