"""The runner alone, without a real model: a stand-in target whose next token is always the last one plus
one drives ``ModelRunner`` through the scheduler over a ``BlockPool``, so what the runner itself does is
checked: prefill and decode dispatch, each request's results in batch order, released rows, and a decode
step run ahead that serves the next step or is dropped with its state restored."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from outpace.cache.block_pool import BlockPool
from outpace.engine.runner import ModelRunner
from outpace.engine.scheduler import Scheduler
from outpace.request import Request
from outpace.sampling_params import SamplingParams

VOCAB = 50


@dataclass
class _Output:
    hidden_states: torch.Tensor  # [num_tokens, VOCAB]: each token's one-hot
    aux_hidden_states: torch.Tensor | None = None


@dataclass
class _Config:
    vocab_size: int = VOCAB


class SuccessorModel(nn.Module):
    """A target with no layers: its logits at a token put all their mass on the token after it."""

    def __init__(self) -> None:
        super().__init__()
        self.config, self.model = _Config(), nn.Module()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> _Output:
        return _Output(nn.functional.one_hot(input_ids, VOCAB).float())

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return 10.0 * hidden.roll(1, dims=-1)  # [n, VOCAB]

    def set_aux_hidden_state_layers(self, layer_ids: tuple[int, ...]) -> None:
        assert not layer_ids


def _build(
    max_seqs: int = 4, run_ahead: bool = False, num_blocks: int = 64
) -> tuple[ModelRunner, Scheduler, BlockPool]:
    pool = BlockPool(num_blocks, 4)
    runner = ModelRunner(SuccessorModel(), pool, torch.float32, "cpu", "torch", max_seqs, 256)
    scheduler = Scheduler(pool, max_seqs, 64, on_free=lambda r: runner.release(r.request_id))
    if run_ahead:
        runner.capture((1, 2, 4))  # on the CPU the "graphs" replay eagerly
        runner.enable_run_ahead(256)
    return runner, scheduler, pool


def _run(runner: ModelRunner, scheduler: Scheduler, requests: list[Request]) -> list[list[int]]:
    """Every request to its max_tokens, as the engine commits a step's results."""
    for r in requests:
        scheduler.add(r)
    while scheduler.has_unfinished:
        _step(runner, scheduler)
    return [r.output_token_ids for r in requests]


def _step(runner: ModelRunner, scheduler: Scheduler) -> None:
    """One step, committed as the engine commits it (a request at its max_tokens finishes)."""
    batch = scheduler.schedule()
    results = runner.execute(batch)
    at = 0
    for s, n, committed in zip(batch, results.num_new_tokens, results.num_committed):
        req = s.request
        req.num_computed_tokens += committed
        req.token_ids += results.new_token_ids[at : at + n]
        at += n
        if req.num_output_tokens >= req.params.max_tokens:
            del req.token_ids[len(req.prompt_token_ids) + req.params.max_tokens :]
            scheduler.finish(req, "length")


def _requests(lengths: list[int]) -> list[Request]:
    return [
        Request(
            f"r{i}",
            [7 * i + j for j in range(3)],
            SamplingParams(temperature=0, max_tokens=n),
            seed=i,
        )
        for i, n in enumerate(lengths)
    ]


@pytest.mark.parametrize("run_ahead", [False, True], ids=["eager", "run-ahead"])
def test_each_request_gets_its_own_tokens_and_every_row_returns(run_ahead):
    runner, scheduler, pool = _build(run_ahead=run_ahead)
    requests = _requests(
        [5, 9, 2, 7, 4, 6]
    )  # six requests through four rows: joins while others decode
    outputs = _run(runner, scheduler, requests)
    for r, out in zip(requests, outputs):
        last = r.prompt_token_ids[-1]
        assert out == [(last + 1 + k) % VOCAB for k in range(r.params.max_tokens)], r.request_id
    assert not runner.req_table.held_by and runner.req_table.num_free == 4
    assert pool.num_free == pool.num_blocks


def test_a_step_run_ahead_serves_the_next_steps():
    """Requests decoding together, a pool too small for all (a request is preempted and recomputed): each
    step's successor is launched ahead and serves the next step, and every token is exact."""
    runner, scheduler, pool = _build(run_ahead=True, num_blocks=9)
    ahead, taken = runner.run_ahead, []
    take = ahead.take

    def counting_take(ids, starts):
        launch = take(ids, starts)
        taken.append(launch is not None)
        return launch

    ahead.take = counting_take
    requests = _requests([12, 12, 12])
    outputs = _run(runner, scheduler, requests)
    for r, out in zip(requests, outputs):
        assert out == [(r.prompt_token_ids[-1] + 1 + k) % VOCAB for k in range(12)], r.request_id
    assert sum(taken) >= 6 and sum(r.metrics.num_preemptions for r in requests) > 0
    assert not runner.req_table.held_by and pool.num_free == pool.num_blocks


def test_dropping_the_step_run_ahead_restores_the_state_the_host_holds():
    """Once a step has run ahead, dropping it puts each request's device length and last token back to
    what the host has committed; decoding then goes on exactly."""
    runner, scheduler, _ = _build(run_ahead=True)
    requests = _requests([10, 10])
    for r in requests:
        scheduler.add(r)
    while runner.run_ahead.launch is None:
        batch = scheduler.schedule()
        results = runner.execute(batch)
        at = 0
        for s, n, committed in zip(batch, results.num_new_tokens, results.num_committed):
            s.request.num_computed_tokens += committed
            s.request.token_ids += results.new_token_ids[at : at + n]
            at += n
    table = runner.req_table
    rows = [table.index_of(r.request_id) for r in requests]
    assert [int(table.lengths[i]) for i in rows] != [
        r.num_computed_tokens for r in requests
    ]  # ran ahead
    runner.run_ahead.drop()
    assert [int(table.lengths[i]) for i in rows] == [r.num_computed_tokens for r in requests]
    assert [int(table.last_tokens[i]) for i in rows] == [r.token_ids[-1] for r in requests]
    _run(runner, scheduler, [])  # the two requests, already queued, to their end
    assert [r.output_token_ids for r in requests] == [
        [(r.prompt_token_ids[-1] + 1 + k) % VOCAB for k in range(10)] for r in requests
    ]


def test_a_request_ended_under_a_step_run_ahead_for_it_retires_its_row_without_waiting(monkeypatch):
    """A request that ends while the step run ahead for it is in flight (aborted here; in a closed batch with
    speculation, one that reached its length) does not wait for that step: its row is held by no one and given
    to no one until that step has been read, then free. A new request admitted meanwhile takes another row,
    and every token stays exact."""
    from outpace.engine.launch import HostCopy

    runner, scheduler, _ = _build(max_seqs=3, run_ahead=True)
    first, second = _requests([10, 10])
    for r in (first, second):
        scheduler.add(r)
    while runner.run_ahead.launch is None:
        _step(runner, scheduler)
    table = runner.req_table
    row, free_before = table.index_of(first.request_id), table.num_free
    assert runner.run_ahead.ran_for([first.request_id])
    waits = []
    with monkeypatch.context() as m:
        m.setattr(HostCopy, "wait", lambda self: waits.append(self))
        scheduler.finish(first, "abort")
    assert not waits  # the host goes on while the step runs
    assert first.request_id not in table.held_by and table.num_free == free_before
    late = Request("late", [1, 2, 3], SamplingParams(temperature=0, max_tokens=6), seed=9)
    scheduler.add(late)
    _step(runner, scheduler)  # the late request's prefill, the step run ahead read
    assert table.index_of("late") != row
    _run(runner, scheduler, [])
    for r in (second, late):
        assert r.output_token_ids == [
            (r.prompt_token_ids[-1] + 1 + k) % VOCAB for k in range(r.params.max_tokens)
        ]
    assert not table.held_by and table.num_free == 3


def test_the_batch_rows_are_written_again_only_when_they_or_the_buffer_changed():
    """``DecodeStep.set_rows`` skips the copy when ``batch_indices`` holds the rows already, and writes
    again after the rows change or something else wrote the buffer (its version counter moved)."""
    runner, _, _ = _build(max_seqs=4)
    step, pad = runner.decode_step, runner.req_table.padding_index
    step.set_rows([2, 0], 4)
    assert step.batch_indices.tolist() == [2, 0, pad, pad]
    version = step.batch_indices._version
    step.set_rows([2, 0], 4)
    assert step.batch_indices._version == version  # nothing copied
    step.batch_indices.fill_(pad)  # e.g. ModelRunner.profile
    step.set_rows([2, 0], 4)
    assert step.batch_indices.tolist() == [2, 0, pad, pad]
    step.set_rows([1], 2)
    assert step.batch_indices[:2].tolist() == [1, pad]


def test_a_steps_host_copy_is_reused_only_once_read():
    """``HostCopy`` takes the host tensor of an output already read, never one still waiting to be read."""
    from outpace.engine.launch import HostCopy

    spare = {}
    first = HostCopy(torch.tensor([1, 2, 3]), spare)
    second = HostCopy(torch.tensor([4, 5, 6]), spare)  # (the first is not read yet)
    assert second.host is not first.host
    buffer = first.host
    assert first.tolist() == [1, 2, 3]
    third = HostCopy(torch.tensor([7, 8, 9]), spare)
    assert third.host is buffer
    assert second.tolist() == [4, 5, 6] and third.tolist() == [7, 8, 9]
    assert HostCopy(torch.tensor([1, 2]), spare).tolist() == [1, 2]  # another shape: its own tensor
