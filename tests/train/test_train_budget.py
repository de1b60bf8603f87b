"""The training loop's time budget (train/loop.py ``StepBudget``): the calibration window sets the run's
length, and a run whose steps turn slower mid-way (a GPU shared with other runs) is shortened again so it
ends within the budget; a run that turns faster is never lengthened (its cosine schedule stays)."""

import pytest

from outpace.train import loop
from outpace.train.loop import OptimConfig, StepBudget


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(
    monkeypatch, step_seconds, opt: OptimConfig, first_step: int = 0, spent: float = 0.0
) -> tuple[int, float]:
    """Drive a StepBudget as train() does; ``step_seconds(step)`` is each step's cost. -> (steps run, seconds)."""
    clock = FakeClock()
    monkeypatch.setattr(loop.time, "perf_counter", clock)
    budget = StepBudget(opt, start=-spent, first_step=first_step)
    total, step = opt.steps, first_step
    while step < total:
        if budget.due(step):
            total = budget.plan(step, total)
        clock.now += step_seconds(step)
        step += 1
    return step, clock.now + spent


def test_a_steady_run_fills_its_budget(monkeypatch):
    opt = OptimConfig(steps=100_000, max_minutes=1.0)
    steps, seconds = run(monkeypatch, lambda s: 0.01, opt)
    assert 5900 <= steps <= 6000 and 59.0 <= seconds <= 60.0


def test_a_run_that_turns_slower_is_shortened_to_stay_within_its_budget(monkeypatch):
    opt = OptimConfig(steps=100_000, max_minutes=1.0, replan_every=100)
    # calibrated at 10 ms a step, then three times slower from step 1000 (other runs start on the GPU)
    steps, seconds = run(monkeypatch, lambda s: 0.01 if s < 1000 else 0.03, opt)
    assert seconds <= 60.0 + 100 * 0.03, seconds  # over by at most one window of the slower steps
    assert 1000 < steps < 3000


def test_a_run_that_turns_faster_is_never_lengthened(monkeypatch):
    opt = OptimConfig(steps=100_000, max_minutes=1.0, replan_every=100)
    steps, seconds = run(monkeypatch, lambda s: 0.03 if s < 1000 else 0.01, opt)
    assert steps == pytest.approx(2000, abs=20) and seconds < 60.0


def test_a_resumed_run_plans_from_its_own_steps_within_what_is_left(monkeypatch):
    opt = OptimConfig(steps=100_000, max_minutes=1.0)
    steps, seconds = run(monkeypatch, lambda s: 0.01, opt, first_step=3000, spent=30.0)
    assert 5900 <= steps <= 6000 and 59.0 <= seconds <= 60.0


def test_a_resumed_run_does_not_calibrate_on_its_warm_up(monkeypatch):
    """A resumed process compiles its step again: its first steps are slow. Calibrating on them shortened a
    resumed DFlash run from 8882 to 5903 steps on an H200 (benchmarks/results/train_ceiling/): the window opens a
    third of the way into calibration_steps after the step the process starts at, as it does at step 0."""
    opt = OptimConfig(steps=100_000, max_minutes=1.0)
    steps, seconds = run(
        monkeypatch, lambda s: 5.0 if s < 3002 else 0.01, opt, first_step=3000, spent=20.0
    )
    assert (
        5950 <= steps <= 6010 and 59.0 <= seconds <= 60.0
    )  # calibrated on the warm-up it stopped at 3078


def test_the_step_count_is_the_cap_when_it_fits(monkeypatch):
    opt = OptimConfig(steps=500, max_minutes=1.0)
    assert run(monkeypatch, lambda s: 0.01, opt)[0] == 500


def test_a_whole_run_budget_leaves_the_loop_what_the_data_left_less_the_heldout_reserve(
    monkeypatch,
):
    """``total_minutes`` (DistillRecipe.loop_optim): the loop gets the run's budget less the time the data took
    and ``heldout_reserve_minutes``; ``max_minutes`` still caps it; a budget spent before training is refused by
    name, and so is one no larger than its reserve."""
    from outpace.train import distill
    from outpace.train.recipes.eagle3 import Eagle3Recipe

    clock = FakeClock()
    monkeypatch.setattr(distill.time, "perf_counter", clock)
    clock.now = 150.0  # the data took 2.5 minutes of a run that started at 0
    assert Eagle3Recipe(max_minutes=None, total_minutes=10).loop_optim(
        0.0
    ).max_minutes == pytest.approx(6.5)
    assert Eagle3Recipe(max_minutes=5.0, total_minutes=10).loop_optim(0.0).max_minutes == 5.0
    assert Eagle3Recipe(max_minutes=5.0, total_minutes=10, heldout_reserve_minutes=3).loop_optim(
        0.0
    ).max_minutes == pytest.approx(4.5)
    assert (
        Eagle3Recipe(max_minutes=5.0).loop_optim(0.0).max_minutes == 5.0
    )  # no whole-run budget: as set
    with pytest.raises(ValueError, match="total_minutes=3.* is spent before training"):
        Eagle3Recipe(total_minutes=3).loop_optim(0.0)
    with pytest.raises(ValueError, match="total_minutes=1.*more than heldout_reserve_minutes"):
        Eagle3Recipe(total_minutes=1)
