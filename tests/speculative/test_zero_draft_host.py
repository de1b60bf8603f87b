"""A zero-draft step of the speculative engine costs the host what a plain decode step costs: outside the decode
iteration (captured on the GPU) it runs no Python per request beyond plain decoding's, whatever the batch
(adaptive speculation settles on zero drafts where drafts do not pay, and a hybrid target, which never runs a
step ahead, waits for every microsecond of it: benchmarks/scripts/diag_host_cost.py --method). Counted as
Python function calls (``sys.setprofile``), not timed."""

import sys
from pathlib import Path

import pytest

from outpace.config import EngineConfig, SpeculativeConfig
from outpace.engine.engine import LLMEngine
from outpace.sampling_params import SamplingParams
from outpace.speculative.adaptive import DraftLengthChooser

ZOO = Path(__file__).resolve().parents[2] / "zoo"
METHODS = {
    "mtp": ("tinyqwen35", SpeculativeConfig("mtp", num_steps=2, adaptive=True)),
    "eagle3": (
        "tinypy",
        SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3, adaptive=True),
    ),
    "ngram": ("tinypy", SpeculativeConfig("ngram", num_steps=3, adaptive=True)),
}
COUNTED_STEPS = 12


def _engine(target: str, rows: int, spec: SpeculativeConfig) -> LLMEngine:
    engine = LLMEngine(
        EngineConfig(
            model=str(ZOO / target),
            device="cpu",
            dtype="float32",
            max_num_seqs=rows,
            num_kv_blocks=rows * 16 + 32,
            run_ahead=False,  # (as hybrids run on the GPU)
            speculative=spec,
        ),
        progress=False,
    )
    engine.capture_graphs()  # (on the CPU the "replays" run eagerly)
    for chooser in engine.choosers.values():
        chooser.probe_every = 10**6  # no probe among the counted steps
    return engine


def _submit(engine: LLMEngine, rows: int) -> None:
    for i in range(rows):
        prompt = [1 + (7 * i + 3 * j) % 300 for j in range(9 + i)]
        params = SamplingParams(temperature=0, max_tokens=2 * COUNTED_STEPS + 8, ignore_eos=True)
        engine.add_request(prompt, params)


def _calls_per_step(engine: LLMEngine, rows: int) -> tuple[float, int]:
    """Python calls per decode step outside the decode iteration (``DecodeStep.step``), all ``rows`` decoding,
    and the drafts those steps drafted: first a batch that tries every draft shape once (the chooser then knows
    their costs), then a second, counted from its second decode step on."""
    _submit(engine, rows)
    while engine.has_unfinished_requests:
        engine.step()
    _submit(engine, rows)
    engine.step()  # (the prefill)
    engine.step()
    inside, calls, drafts = [0], [0], [0]
    step, run = engine.runner.decode_step.step, engine.runner.decode_step.run

    def counted_run(key, *args, **kwargs):
        drafts[0] += key.shape.num_steps
        return run(key, *args, **kwargs)

    def iteration(*args, **kwargs):
        inside[0] += 1
        try:
            return step(*args, **kwargs)
        finally:
            inside[0] -= 1

    def profile(frame, event, arg):
        if event == "call" and not inside[0]:
            calls[0] += 1

    engine.runner.decode_step.step, engine.runner.decode_step.run = iteration, counted_run
    sys.setprofile(profile)
    try:
        for _ in range(COUNTED_STEPS):
            engine.step()
    finally:
        sys.setprofile(None)
    assert len(engine.scheduler.running) == rows  # every counted step decoded the whole batch
    return calls[0] / COUNTED_STEPS, drafts[0]


@pytest.mark.parametrize("method", list(METHODS))
def test_a_zero_draft_step_runs_no_python_per_request_beyond_plain_decodings(method, monkeypatch):
    """With drafts far too costly to pay (a fixed cost model, not the CPU's timing), the chooser drafts
    nothing at every counted step; the Python calls such a step makes beyond a plain decode step's do not
    grow with the batch's rows."""
    record = DraftLengthChooser.record_cost
    monkeypatch.setattr(
        DraftLengthChooser,
        "record_cost",
        lambda self, bucket, shape, seconds: record(self, bucket, shape, 1.0 + shape.num_steps),
    )
    target, spec = METHODS[method]
    extra = {}
    for rows in (2, 6):
        plain, _ = _calls_per_step(_engine(target, rows, SpeculativeConfig()), rows)
        speculative, drafts = _calls_per_step(_engine(target, rows, spec), rows)
        assert drafts == 0
        extra[rows] = speculative - plain
    assert (extra[6] - extra[2]) / 4 < 0.5, extra  # less than a call per request
