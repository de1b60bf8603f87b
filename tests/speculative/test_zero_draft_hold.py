"""Held zero-draft steps (speculative/proposer.py, holding; engine/step_key.py ``HoldRule``): a zero-draft
step of EAGLE3 or MTP runs no drafter forward and appends its committed row to the drafter's pending window;
when a window could overflow the step flushes (runs the forward as any step). Output stays lossless, and the
drafts after held steps are exactly those of the same run in which every zero-draft step flushes.
fp32 on the CPU, whose "captured" steps replay eagerly: the forward hooks and the recorded drafts see every
step (a CUDA graph's replay would run neither)."""

from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.engine.step_key import HoldRule, SamplingMode, StepKey
from outpace.speculative.proposer import HOLD_ROWS, DraftShape

ZOO = Path(__file__).resolve().parents[2] / "zoo"
EAGLE3 = SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3, adaptive=True)
MTP2 = SpeculativeConfig("mtp", num_steps=2, adaptive=True)
# name -> (target, drafter): tinypy's 3 chained MTP layers keep K = 2 rows; tinyds' (DeepSeek-V3 style)
# read the post-norm state; tinyqwen35 is a hybrid target (recurrent state)
CASES = {
    "eagle3": ("tinypy", EAGLE3),
    "mtp": ("tinypy", SpeculativeConfig("mtp", num_steps=3, adaptive=True)),
    "mtp-deepseek": ("tinyds", MTP2),
    "mtp-qwen35": ("tinyqwen35", MTP2),
}
# The forced draft lengths, step after step (at most 2: every case's shapes): runs of zero drafts longer
# than a window holds (so some steps flush) between drafting steps of each length.
SCHEDULE = [2, 1, 2] + [0] * (HOLD_ROWS + 6) + [1] + [0] * 3 + [2, 2] + [0] * (HOLD_ROWS + 3)
PARAMS = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
PROMPTS = [[(i * 37 + j * 11) % 300 for j in range(3 + 7 * i)] for i in range(6)]


class Recorder:
    """An engine whose chooser follows SCHEDULE, recording each decode step's key, the drafter forwards it
    ran (forward hooks on the draft network) and, for drafting steps, the requests' drafts."""

    def __init__(self, llm: LLM) -> None:
        runner, proposer = llm.engine.runner, llm.engine.runner.proposer
        self.runner, self.turn = runner, 0
        self.forwards, self.steps, self.drafts = 0, [], []
        for chooser in llm.engine.choosers.values():
            chooser.choose = self._choose
        if hasattr(proposer, "draft_model"):  # EAGLE3: every module of its own (fc too)
            target = {id(m) for m in runner.model.modules()}
            hooked = [m for m in proposer.draft_model.modules() if id(m) not in target]
        else:  # MTP: its layers (the target's modules, some of them shared with its forward)
            hooked = proposer.layers
        for m in hooked:
            m.register_forward_hook(self._count)
        run, draft = runner.decode_step.run, proposer.draft

        def recorded_run(key, *args, **kwargs):
            before = self.forwards
            out = run(key, *args, **kwargs)
            self.steps.append((key, self.forwards - before))
            return out

        def recorded_draft(rows, shape):
            drafts = draft(rows, shape)
            if shape.num_steps:  # the requests' rows (the padding row has length 0)
                real = zip(drafts.token_ids.tolist(), rows.lengths.tolist())
                self.drafts.append([tokens for tokens, length in real if length > 0])
            return drafts

        runner.decode_step.run, proposer.draft = recorded_run, recorded_draft

    def _choose(self, bucket, ids, remaining=None) -> DraftShape:
        self.turn += 1
        shape = DraftShape(SCHEDULE[(self.turn - 1) % len(SCHEDULE)])
        assert shape in self.runner.shapes
        return shape

    def _count(self, module, args, out) -> None:
        self.forwards += 1


def _captured(target: str, spec: SpeculativeConfig, device: str = "cpu") -> LLM:
    """An engine whose decode steps are captured (on the CPU: replayed eagerly), with steps run ahead,
    batches padded to a bucket (the padding row appends too), 6 requests in 4 rows and preemptions."""
    llm = LLM(
        str(ZOO / target),
        device=device,
        dtype="float32",
        max_num_seqs=4,
        speculative=spec,
        enable_prefix_caching=False,
        num_kv_blocks=20,
    )
    llm.engine.capture_graphs()
    return llm


@pytest.mark.parametrize("case", list(CASES))
def test_held_steps_run_no_forward_and_change_no_draft(case):
    """Greedy output equals plain decoding; held steps run no drafter forward, flushing ones do; and every
    draft equals the draft of the same schedule with every zero-draft step flushing, where every forward runs
    over whole windows, though drafting steps after drafting steps ran over the narrow windows."""
    target, spec = CASES[case]
    plain = LLM(str(ZOO / target), device="cpu", dtype="float32").generate(PROMPTS, PARAMS)
    plain = [o.token_ids for o in plain]
    llm = _captured(target, spec)
    assert any(key.hold for key in llm.engine.runner.decode_step.graphs)
    held = Recorder(llm)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    zero = [(key.hold, forwards) for key, forwards in held.steps if key.shape.num_steps == 0]
    holds = [f for hold, f in zero if hold]
    flushes = [f for hold, f in zero if not hold]
    assert len(holds) > 2 * HOLD_ROWS and len(flushes) > 1, zero
    assert set(holds) == {0} and min(flushes) > 0
    drafting = [key.narrow for key, _ in held.steps if key.shape.num_steps]
    assert drafting.count(True) > 4 and drafting.count(False) > 4, drafting

    llm = _captured(target, spec)
    llm.engine.runner.holds.window = 0  # every zero-draft step flushes
    flushed = Recorder(llm)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == plain
    assert not any(key.hold or key.narrow for key, _ in flushed.steps)
    assert len(held.drafts) > 4 and held.drafts == flushed.drafts


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_held_and_narrow_steps_replay_captured_graphs_losslessly_on_gpu(case):
    """The same schedule as CUDA graph replays in fp32 (the drafter's forwards and drafts are then out of
    the hooks' sight): greedy output equals plain decoding, with held, flushing, narrow and whole-window
    drafting steps among the replays."""
    target, spec = CASES[case]
    plain = LLM(str(ZOO / target), device="cuda", dtype="float32").generate(PROMPTS, PARAMS)
    llm = _captured(target, spec, "cuda")
    assert all(call.graph is not None for call in llm.engine.runner.decode_step.graphs.values())
    recorded = Recorder(llm)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    keys = [key for key, _ in recorded.steps]
    assert all(key in llm.engine.runner.decode_step.graphs for key in keys)
    kinds = {(key.shape.num_steps > 0, key.hold, key.narrow) for key in keys}
    assert kinds == {
        (False, True, False),
        (False, False, False),
        (True, False, True),
        (True, False, False),
    }


class FakeProposer:
    hold_window = 6
    narrow_window = 4

    def pending_rows(self, shape: DraftShape) -> int:
        return 1 + shape.num_steps


def test_hold_rule_bounds_each_request_and_undoes_a_dropped_step():
    rule, zero = HoldRule(FakeProposer()), DraftShape(0)

    def step(ids, shape):
        key = StepKey(1, shape, SamplingMode.GREEDY, hold=rule.holds(ids, shape))
        return key, rule.advance(ids, key)

    assert not rule.holds(["a"], DraftShape(2)) and rule.may_hold(zero)
    assert rule.narrow_variants(DraftShape(2)) == (False, True) and rule.narrow_variants(zero) == (
        False,
    )
    step(["a"], DraftShape(3))  # 4 rows pending at most: two held steps fit a window of 6
    assert rule.narrow(["a"], DraftShape(1))  # 4 rows fit the narrow window
    assert [step(["a"], zero)[0].hold for _ in range(3)] == [True, True, False]
    step(["c"], DraftShape(1))  # 2 rows
    step(["c"], zero), step(["c"], zero)  # held: 4 rows
    assert rule.narrow(["c"], DraftShape(2))
    step(["c"], zero)  # held: 5 rows, more than the narrow window holds
    assert not rule.narrow(["a", "c"], DraftShape(2)) and not rule.narrow(["a"], zero)
    key, before = step(["a", "b"], zero)  # "b" is fresh (1 row): "a" has 1 again after the flush
    assert key.hold and before == (1, None)
    rule.restore(["a", "b"], before)  # the step run ahead was dropped
    assert rule.advance(["a", "b"], key) == (1, None)
    rule.forget("a")
    assert rule.holds(["a"], zero)
    assert not HoldRule(None).may_hold(zero)
    with pytest.raises(ValueError, match="only zero-draft steps"):
        StepKey(1, DraftShape(1), SamplingMode.GREEDY, hold=True)
    with pytest.raises(ValueError, match="only drafting steps narrow"):
        StepKey(1, zero, SamplingMode.GREEDY, narrow=True)
