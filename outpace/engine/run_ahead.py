"""Running a decode step ahead (``ModelRunner.enable_run_ahead``).

Right after a decode step the next one is launched for the same requests and for those whose prefill
the step completed, before the host reads the first one's tokens: everything it needs is already in
the request state on the device (a prefill's writes are queued before it). While the GPU runs it, the
engine appends tokens, checks stop conditions and schedules. If the next step's batch is those requests
(or some of them, others having finished), at the lengths the step run ahead started from, its results
serve it, whatever new prompts that step also prefills; otherwise it is dropped and the request state
it advanced is restored, so the state is again the one after the tokens the host holds (the KV rows it
wrote lie past every committed row, and are rewritten before anything reads them). Under a server's
load requests end and join at most steps, so a step run ahead that a join dropped would be a step
computed twice (benchmarks/scripts/diag_closed_loop.py). A request that leaves while a step runs ahead for it
(finished, aborted, preempted) is never restored (``forget``): a preempted one may be prefilled again into the
same row before the step is read.

A hybrid target's recurrent state (MBs a request) is not saved: the copy cost its bytes twice over in traffic, a
step run ahead more than the host time it hid (plain decoding's step ms at batch 1 / 8 / 32 on the H200, saving
it, against not running ahead: Qwen3.5 (49 MiB a request) 4.88 / 5.58 / 7.80 against 4.90 / 5.49 / 7.12,
Nemotron-H-8B (97 MiB) 4.86 / 6.11 / 9.27 against 4.69 / 5.63 / 7.75; benchmarks/results/gpu_2026-11-30 call 1),
so before 2026-12-07 a batch whose state exceeded 512 MiB (Qwen3.5 past 10 requests, Nemotron-H past 5) did not
run ahead and the host's time between its steps was the GPU's idle time. Instead nothing is ever restored there: the
engine makes the batch after a step run ahead decode exactly the requests it ran for that are still running
(``reconcile``). One the scheduler's token budget left out decodes all the same (its rows were reserved by the
step run ahead); one that was not in the step waits for the next, and no step runs ahead of this one, so that the
next batch is launched whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from outpace.cache.block_pool import BlockPool
from outpace.engine.decode_step import DecodeStep
from outpace.engine.launch import DecodeLaunch
from outpace.engine.request_table import RequestTable
from outpace.engine.scheduler import ScheduledRequest
from outpace.engine.step_key import HoldRule, StepKey
from outpace.host_copies import to_device
from outpace.request import Request
from outpace.speculative.proposer import DraftShape

if TYPE_CHECKING:
    from outpace.engine.copy_pieces_kernel import CopyPieces

# The least a save plan copies in one launch (``copies_in_one_launch``): a drafter's rows where they are large, not
# the lengths and last tokens, whose few bytes keep torch's copies, as every dense model's steps were measured with
# (the one launch's host cost against theirs is not measured). Measured when hybrids' recurrent states were saved:
# the Qwen3-Next slice's 201 MB at batch 8 in 51.5 us, where torch's four launches took 78 (gpu_2026-12-01e).
ONE_LAUNCH_BYTES = 1 << 20


class SavedRows(NamedTuple):
    """Request state saved before a step run ahead: ``tensors[b][j]`` is buffer b's row ``rows[j]``."""

    rows: list[int]  # ascending
    tensors: list[torch.Tensor]  # one per state buffer: [len(rows), ...]


class _SavePlan(NamedTuple):
    """Where a step run ahead saves the request state of its rows: ``saved`` (SavedRows.tensors), and the copies
    into it: on CUDA those of whole 32-bit words in one launch (engine/copy_pieces_kernel.py), the others in
    lists of one dtype each (``torch._foreach_copy_`` over one dtype is one launch or few)."""

    rows: list[int]  # ascending
    buffers: list[torch.Tensor]  # the state buffers it copies from
    saved: list[torch.Tensor]
    copies: list[tuple[list[torch.Tensor], list[torch.Tensor]]]  # (targets, sources) of one dtype
    one_launch: CopyPieces | None  # the copies of whole words, where they take one launch

    def run(self) -> None:
        """Every copy of the plan."""
        if self.one_launch is not None:
            self.one_launch()
        for targets, sources in self.copies:
            torch._foreach_copy_(targets, sources)


def save_plan(buffers: list[torch.Tensor], rows: list[int]) -> _SavePlan:
    """The copies of ``rows`` (ascending) of each buffer into new tensors, a run of consecutive rows at a time:
    on CUDA those of whole 32-bit words in one launch, the others by dtype."""
    saved = [b.new_empty((len(rows), *b.shape[1:])) for b in buffers]
    pairs = []  # (target, source)
    at = 0
    for first, end in row_runs(rows):
        for buffer, into in zip(buffers, saved):
            pairs.append((into[at : at + end - first], buffer[first:end]))
        at += end - first
    one_launch = None
    nbytes = sum(source.numel() * source.element_size() for _, source in pairs)
    if pairs and copies_in_one_launch(buffers, nbytes):
        from outpace.engine.copy_pieces_kernel import CopyPieces  # Triton: a GPU dependency

        words, others = [], []
        for pair in pairs:
            (words if CopyPieces.takes(*pair) else others).append(pair)
        one_launch = CopyPieces.of(*zip(*words)) if words else None
        pairs = others
    copies: dict[torch.dtype, tuple[list, list]] = {}
    for target, source in pairs:
        targets, sources = copies.setdefault(source.dtype, ([], []))
        targets.append(target)
        sources.append(source)
    return _SavePlan(rows, buffers, saved, list(copies.values()), one_launch)


def copies_in_one_launch(buffers: list[torch.Tensor], nbytes: int) -> bool:
    """Whether a save plan of ``nbytes`` copies its whole words in one launch (engine/copy_pieces_kernel.py): on
    CUDA, from ``ONE_LAUNCH_BYTES`` (tests force it into Triton's interpreter)."""
    return buffers[0].is_cuda and nbytes >= ONE_LAUNCH_BYTES


def row_runs(rows: list[int]) -> list[tuple[int, int]]:
    """Ascending ``rows`` as runs of consecutive rows: (first, end) each."""
    runs, first = [], rows[0]
    for before, row in zip(rows, rows[1:]):
        if row != before + 1:
            runs.append((first, before + 1))
            first = row
    runs.append((first, rows[-1] + 1))
    return runs


def length_after(chunk: ScheduledRequest) -> int:
    """A prefilled request's KV rows once its chunk is committed."""
    return chunk.request.num_computed_tokens + chunk.num_new_tokens


class RunAhead:
    """The one decode step launched ahead, if any, and the rule that decides whether to launch it."""

    def __init__(
        self,
        pool: BlockPool,
        req_table: RequestTable,
        decode_step: DecodeStep,
        per_step: int,
        lookahead: int,
        max_model_len: int,
        holds: HoldRule | None = None,
        recurrent: bool = False,
    ) -> None:
        """``per_step``: the most KV rows a decode step writes per request (the largest draft shape's
        nodes); ``lookahead``: the rows past them a drafter reads; positions stay below ``max_model_len``;
        ``holds``: the host's bounds on drafters' pending rows, which a drop restores with the device state;
        ``recurrent``: a hybrid target, whose recurrent state is not saved (module docstring)."""
        self.pool, self.req_table, self.decode_step = pool, req_table, decode_step
        self.holds, self.recurrent = holds, recurrent
        self.per_step, self.lookahead = per_step, lookahead
        self.limit = min(max_model_len, req_table.max_rows)
        self.launch: DecodeLaunch | None = None
        self._plans: dict[
            StepKey, _SavePlan
        ] = {}  # a key's last plan: the batch's rows, its tensors
        # ``reconcile`` left a request out of the next batch: no step runs ahead of it
        self._launch_none_next = False

    def ran_for(self, request_ids) -> bool:
        """Whether the step run ahead (if any) ran for one of these requests."""
        return self.launch is not None and any(
            rid in self.launch.request_ids for rid in request_ids
        )

    def saved_state(self, key: StepKey, req_indices: list[int]) -> SavedRows:
        """The request state of these request rows before a step of ``key``, to restore on a drop: the rows in
        ascending order, copied a run of consecutive rows at a time into tensors kept for the next step of the
        same key and rows (one step runs ahead at a time, and a step's saved state is dead once the next is
        launched ahead: ``take`` or ``drop`` ended it), in one launch on CUDA (``_SavePlan.run``); a hybrid's
        recurrent state is not among them (module docstring). A clone a buffer costs host time: 14 clones took
        about 300 us of a 853 us step of the Qwen3-Next slice at batch 1 on the H200 under torch.profiler, the GPU
        idle behind them (benchmarks/results/gpu_2026-11-30c, call 3's host_profile.py)."""
        rows, buffers = sorted(req_indices), self.decode_step.state_buffers(key, recurrent=False)
        plan = self._plans.get(key)
        if (
            plan is None
            or plan.rows != rows
            or len(plan.buffers) != len(buffers)
            or any(a is not b for a, b in zip(plan.buffers, buffers))
        ):
            self._plans.clear()  # one plan's tensors at a time
            plan = self._plans[key] = save_plan(buffers, rows)
        plan.run()
        return SavedRows(rows, plan.saved)

    def take(self, request_ids: tuple[str, ...], starts: tuple[int, ...]) -> DecodeLaunch | None:
        """The step run ahead if it serves this batch (each request was in it, from the length it has
        now: requests that have left since do not matter); any other is dropped. A request it ran for that is
        still here but left out of this batch (the scheduler's token budget held it back) gets the state the
        step started from back: the step advanced its lengths, recurrent state and drafter rows past tokens the
        host never received (an EAGLE3 tree at a 16-token budget lost a token so: tests/engine/test_cuda_graphs.py)."""
        launch = self.launch
        if launch is None:
            return None
        # (not for a request that left: a new one given its id, at the length it started from, is not it)
        ran = {
            rid: start
            for rid, start in zip(launch.request_ids, launch.starts)
            if rid not in launch.left
        }
        if request_ids and tuple(map(ran.get, request_ids)) == starts:
            self.launch = None
            served = set(request_ids)
            self._restore(launch, [rid not in served for rid in launch.request_ids])
            return launch
        self.drop()
        return None

    def forget(self, request_id: str) -> None:
        """``request_id`` left while the step run ahead ran for it (finished, aborted or preempted): its row is
        never restored, even where a prefill gives the request that row again before the step is read."""
        if self.ran_for([request_id]):
            self.launch.left.add(request_id)

    def reconcile(
        self, decoding: list[Request], running: list[Request]
    ) -> tuple[list[Request], list[Request]]:
        """A hybrid target's next batch against the step run ahead (module docstring), given the requests the
        scheduled batch decodes and every running one: (the running requests the step ran for that the batch
        leaves out, which must decode in it; the requests it decodes that the step did not run for at their
        length, which must not: no step runs ahead of this one, so that they decode in the next). Nothing to
        change for a dense target, without a step run ahead, or where every request it ran for has left (it
        serves no one: ``take`` drops it, restoring nothing)."""
        launch = self.launch
        if not self.recurrent or launch is None:
            return [], []
        ran = {
            rid: start
            for rid, start in zip(launch.request_ids, launch.starts)
            if rid not in launch.left
        }
        live = [r for r in running if r.request_id in ran]
        if not live:
            return [], []
        scheduled = {r.request_id for r in decoding}
        missing = [r for r in live if r.request_id not in scheduled]
        strangers = [r for r in decoding if ran.get(r.request_id) != r.num_computed_tokens]
        self._launch_none_next = bool(strangers)
        return missing, strangers

    def drop(self) -> None:
        """Undo the step run ahead: wait for it, then restore the request state it started from, for the
        rows still held by the requests it ran for."""
        launch, self.launch = self.launch, None
        if launch is not None:
            launch.copy.wait()
            self._restore(launch, [True] * len(launch.request_ids))

    def _restore(self, launch: DecodeLaunch, undo: list[bool]) -> None:
        """The request state ``launch`` started from back in the rows of its requests marked in ``undo`` that
        still hold them (with the host's bounds on their drafters' pending rows), once it has run."""
        rows = [
            i
            for i, (rid, index) in enumerate(zip(launch.request_ids, launch.req_indices))
            if undo[i] and rid not in launch.left and self.req_table.holds(rid, index)
        ]
        if not rows:
            return
        if self.recurrent:  # (``reconcile`` keeps every such request in the batch)
            advanced = [launch.request_ids[i] for i in rows]
            raise RuntimeError(
                f"a step run ahead advanced the recurrent state of requests {advanced} past the tokens the"
                " host holds, and a hybrid's recurrent state is not saved to restore"
            )
        launch.copy.wait()
        device, held = self.req_table.device, {launch.req_indices[i] for i in rows}
        saved_rows = launch.saved.rows
        # [2, restored rows]: each one's place among the saved rows and its request index, in one queued copy
        kept, indices = to_device(
            [
                [j for j, row in enumerate(saved_rows) if row in held],
                [row for row in saved_rows if row in held],
            ],
            device,
        )
        buffers = self.decode_step.state_buffers(launch.key, recurrent=False)
        for buffer, saved in zip(buffers, launch.saved.tensors):
            buffer.index_copy_(0, indices, saved.index_select(0, kept))
        if self.holds is not None and launch.held_before:
            self.holds.restore(
                [launch.request_ids[i] for i in rows], [launch.held_before[i] for i in rows]
            )

    def may_launch(
        self,
        reqs: list[Request],
        shape: DraftShape,
        joining: list[ScheduledRequest],
        captured: bool,
    ) -> bool:
        """Whether to launch the step after this one (which drafts ``shape``) now, for ``reqs`` (the batch's
        requests that go on past it: ``goes_on``) and ``joining`` (whose prefill this step completes):
        ``captured`` (a graph holds the batch), no grammar (its masks need this step's tokens), no request
        left out of this step by ``reconcile``, and its rows reserved for any acceptance of this one
        (``reserve_rows``)."""
        ahead = reqs + [s.request for s in joining]
        if self._launch_none_next:
            self._launch_none_next = False
            return False
        if not captured or any(r.params.structured_outputs is not None for r in ahead):
            return False
        extra = self.per_step + self.lookahead + 1
        rows = [r.num_computed_tokens + self.per_step + extra for r in reqs]
        rows += [length_after(s) + extra for s in joining]
        return reserve_rows(self.pool, ahead, rows, self.limit, committed=shape.num_steps + 1)


def goes_on(request: Request) -> bool:
    """Whether a request of the step now running may go on past it: it does not surely end by length with it
    (the step commits at least one token a request). One that surely ends stays out of the step run ahead
    (``ModelRunner._decode``): its row there would be wasted, and (until 2026-12-06, when a release began to
    retire the row instead, ``ModelRunner.release``) its release waited for that step, costing the host time that
    running ahead hides. Where speculation staggers a closed batch's ends, stopping the others' step run ahead for it cost each of
    the last steps that time (n-gram at temperature 0.8, a closed batch of 8 on the H200: its last three steps
    4.9 to 5.4 ms against plain decoding's 4.2, benchmarks/results/gpu_2026-12-01f call 1; with it out,
    4.2, 4.6 and 3.9 ms, and the closed batch 0.989x -> 0.994x of plain decoding, call 2); running ahead for it
    too gained nothing (0.989x against 0.990x, gpu_2026-12-01d call 2)."""
    return request.params.max_tokens - request.num_output_tokens > 1


def reserve_rows(
    pool: BlockPool, reqs: Sequence[Request], rows: Sequence[int], limit: int, committed: int
) -> bool:
    """Whether a step may run ahead for these requests (none of which surely ends with the current step:
    ``goes_on``): not every one of them may end by length with the current step (which commits at most
    ``committed`` tokens a request; a step run ahead of one that all may finish in would likely serve
    nobody, and the next step waits for it: at batch 1 with speculation, one step per request), and each
    request's table can hold ``rows`` [i] KV rows (at most ``limit``, the positions graphs and the model
    allow); if so the tables are grown to that now."""
    if not reqs:
        return False
    left = [
        r.params.max_tokens - r.num_output_tokens for r in reqs
    ]  # the tokens each request may still produce
    if max(rows) > limit or max(left) <= committed:
        return False
    missing = [
        pool.blocks_needed(n) - len(pool.table(r.request_id)) for r, n in zip(reqs, rows)
    ]  # blocks
    if sum(m for m in missing if m > 0) > pool.num_free:
        return False
    for r, n, m in zip(reqs, rows, missing):
        if m > 0:
            pool.grow(r.request_id, n)
    return True
