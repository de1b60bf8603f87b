"""Starting the ranks of a tensor- or expert-parallel engine, and noticing when one dies.

Two ways in, one engine:
- outpace starts them (``LLM(..., tensor_parallel_size=N)`` or the CLI in a plain process): this
  process becomes rank 0 and starts ranks 1 .. N-1 with torch.multiprocessing (spawn), which meet it
  over a TCP rendezvous on localhost;
- the standard launcher starts them (``torchrun --nproc-per-node N ...``; RANK / WORLD_SIZE /
  MASTER_ADDR in the environment, several machines alike): each process joins through env://, rank 0
  carries on as the driver and every other rank serves it (``follow``) and then exits.
Either way ranks > 0 build the same engine and follow rank 0 step by step (distributed/lockstep.py).

The engine's ranks are ``EngineConfig.world_size`` (the larger of its tensor- and expert-parallel
sizes), and the group plays the parts those sizes give it (distributed/group.py ``with_parts``). Several
machines are torchrun's business alone: ``torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d
--rdzv-endpoint HOST:PORT -m outpace serve ...`` on each machine gives N x G ranks that meet through
env://, rank 0 (on the first machine) serving and the others following, the same code as on one machine.
When the ranks meet they check that they were all started alike (distributed/agreement.py).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

from outpace.config import EngineConfig
from outpace.distributed.agreement import agree_on_config
from outpace.distributed.group import SINGLE, RankGroup, init_rank_group, with_parts
from outpace.distributed.process_exit import launched_by_torchrun, leave_process

# how long the trainer's collectives wait for a rank that hangs (an engine's: its config's dist_timeout)
COLLECTIVE_TIMEOUT_S = EngineConfig.dist_timeout
LOST_RANK_WAIT_S = (
    5.0  # after a collective failed, how long the survivors wait to hear from each other
)
LEAVE_TIMEOUT_S = 30.0  # how long a closing rank waits for the others to leave their collectives
_started_here: set[int] = set()  # the open Ranks (by id) whose other ranks this process started


class RankFailure(RuntimeError):
    """A rank of a tensor-parallel engine died or stopped answering; the engine cannot continue."""


@dataclass
class Ranks:
    """This process's place in the engine's group, and (on a rank 0 that started them) the other ranks'
    processes."""

    group: RankGroup = SINGLE
    processes: dict[int, mp.Process] = field(
        default_factory=dict
    )  # rank -> process, when started here
    owns_group: bool = (
        False  # this process created the default process group (and destroys it at close)
    )
    closed: bool = False

    def dead(self, wait_s: float = 2.0) -> dict[int, int]:
        """rank -> exit code of the started ranks that have exited (waiting up to ``wait_s`` for one to)."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = {r: p.exitcode for r, p in self.processes.items() if p.exitcode is not None}
            if dead or time.monotonic() >= deadline or not self.processes:
                return dead
            time.sleep(0.05)

    def failure(self, error: BaseException) -> RankFailure | None:
        """The RankFailure that explains ``error`` raised on rank 0 by a step, or None when it is not a
        collective's (a rank died, or the backend reported a broken or timed-out collective)."""
        dead = self.dead()
        if dead:
            described = ", ".join(
                f"rank {r} exited with {exit_reason(code)}" for r, code in sorted(dead.items())
            )
            return RankFailure(
                f"the engine's {described}; the engine stopped the other ranks: {error}"
            )
        if collective_failed(error):
            return RankFailure(
                f"{lost_ranks(self.group)}; a collective of the engine's group failed: {error}"
            )
        return None

    def stop_processes(self, timeout_s: float = 10.0) -> None:
        """Wait for the started ranks to exit (after the engine told them to), terminating any still
        running after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for p in self.processes.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes.values():
            if p.exitcode is None:
                p.terminate()
                p.join(5.0)
        self.processes.clear()

    def leave_together(self, timeout_s: float = LEAVE_TIMEOUT_S) -> None:
        """Wait, on an orderly close, until every rank has left the group's collectives (a barrier on the host
        group), so that no rank destroys the group while another still reads from it: without it a rank 0
        on gloo was seen aborting at exit ("terminate called without an active exception", SIGABRT) or
        hanging, 4 times in 14 two-node runs of tests/distributed/test_expert_parallel_nodes.py, none in 20
        with it. A rank known dead, or one that does not come within ``timeout_s``, ends the wait: the group
        is destroyed anyway."""
        if self.group.size < 2 or self.dead(wait_s=0.0):
            return
        try:
            dist.monitored_barrier(self.group.cpu_group, timeout=timedelta(seconds=timeout_s))
        except RuntimeError as e:  # (torch's DistBackendError is one) a rank gone or late
            print(
                f"outpace rank {self.group.rank}: closing without the others: {e}", file=sys.stderr
            )

    def close(self, timeout_s: float = 10.0) -> None:
        """Destroy the process group if this process created it, then wait up to ``timeout_s`` for the ranks
        it started to exit (terminating any still running). Idempotent.

        The order matters on NCCL, where destroying the group is a collective (torch flushes each
        communicator with ncclCommFinalize before destroying it) and a started rank destroys it before
        exiting (``_rank_main``): waiting for that rank first left both waiting until it was terminated,
        and then this destroy waited for the dead rank forever (seen on two H200s, 2026-11-29). Where a
        started rank is already gone, an NCCL group is aborted instead (torch's local teardown)."""
        self.closed = True
        _started_here.discard(id(self))
        if self.owns_group and dist.is_initialized():
            if dist.get_backend() == "nccl" and self.dead(wait_s=0.0):
                dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
        self.owns_group = False
        self.stop_processes(timeout_s)


def exit_reason(code: int) -> str:
    """A dead process's exit code in words (a negative code is the signal that killed it)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def collective_failed(error: BaseException) -> bool:
    """Whether ``error`` is a collective's: the backend's (NCCL raises DistError subclasses; gloo a plain
    RuntimeError whose message starts with its source path, e.g. ``[.../gloo/transport/tcp/pair.cc:553]
    Connection closed by peer``)."""
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and "gloo" in str(error)
    )


def lost_ranks(group: RankGroup, wait_s: float = LOST_RANK_WAIT_S) -> str:
    """After a collective failed on this rank: which ranks are lost, in words.

    Every surviving rank's collective fails too (gloo at once when a peer's connection closes, NCCL
    within the collective timeout), and each then says so under its own key in the process group's
    store (the default group's: torchrun's agent store, or rank 0's TCP store when outpace started the
    ranks). The ranks that have not said so within ``wait_s`` are the lost ones. A store that no longer
    answers is rank 0's machine gone (it hosts the store)."""
    key = "outpace/failure-seen/{}".format
    try:
        store = dist.distributed_c10d._get_default_store()  # (torch has no public accessor)
        store.set(key(group.rank), "1")
        deadline = time.monotonic() + wait_s
        while True:
            silent = [r for r in range(group.size) if not store.check([key(r)])]
            if not silent or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - the store's connection is gone with its host
        return (
            "rank 0 is lost (the process group's store, which its machine hosts, does not answer)"
        )
    if not silent:
        return "every rank is still running (none is lost)"
    named = ", ".join(map(str, silent))
    return (
        f"rank{'s' if len(silent) > 1 else ''} {named} of {group.size} "
        f"{'are' if len(silent) > 1 else 'is'} lost (did not report the failure within {wait_s:g} s: "
        f"died or hung)"
    )


def join_ranks(config) -> Ranks:
    """This process's ``Ranks`` for an engine of ``config`` (EngineConfig): one rank alone; a rank of a
    group that torchrun started (or that the caller initialised), where ranks > 0 serve rank 0 here and
    then exit the process; or rank 0 of a group whose other ranks it starts now."""
    if config.world_size == 1:
        return Ranks()
    gc.collect()  # an engine dropped but not closed (held in a reference cycle) closes its ranks now
    if _started_here:
        raise RuntimeError(
            "a tensor-parallel engine whose ranks this process started is still open: close() it "
            "(LLM.close, LLMEngine.close) before starting another"
        )
    if dist.is_initialized() or launched_by_torchrun():
        ranks = join_group(config)
        if not ranks.group.is_driver:
            _follow_then_exit(config, ranks)
        return ranks
    return _start_ranks(config)


def join_group(config) -> Ranks:
    """This process's rank in the default process group (initialised through env:// first, as torchrun
    sets it up, unless the caller already did), for an engine of ``config``."""
    owns = not dist.is_initialized()
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    group = init_rank_group(config.world_size, rank, config.device, timeout_s=config.dist_timeout)
    return Ranks(engine_group(config, group), owns_group=owns)


def engine_group(config, group: RankGroup) -> RankGroup:
    """``group`` (just joined) as the engine of ``config`` uses it: playing the parts its tensor- and
    expert-parallel sizes give it, once every rank agrees on the configuration (``ConfigMismatch``
    otherwise, on every rank)."""
    agree_on_config(config, group)
    return with_parts(group, config.tensor_parallel_size, config.expert_parallel_size)


def follow(config, group: RankGroup) -> None:
    """Rank > 0: build the engine of ``config`` and run rank 0's steps until it closes the engine."""
    from outpace.engine.engine import LLMEngine

    LLMEngine(config, progress=False, ranks=Ranks(group)).follow()


def _follow_then_exit(config, ranks: Ranks) -> None:
    """A rank > 0 that torchrun (or the caller) started: follow rank 0, then exit the process: 0 once
    rank 0 closed the engine, 1 naming the lost rank when a collective failed (rank 0 or another died).

    It leaves through distributed/process_exit.py ``leave_process``, without the interpreter's teardown (which
    aborted such a follower on gloo at exit), as the CLI's torchrun-started driver leaves."""
    code = 0
    try:
        follow(config, ranks.group)
    except Exception as e:
        failure = ranks.failure(e)
        if failure is None:
            raise
        print(f"outpace rank {ranks.group.rank}: stopping: {failure}", file=sys.stderr)
        code = 1
    finally:
        ranks.close(timeout_s=1.0)
    leave_process(code)


def _start_ranks(config) -> Ranks:
    port = free_port()
    init_method = f"tcp://127.0.0.1:{port}"
    context = mp.get_context("spawn")
    processes = {}
    for rank in range(1, config.world_size):
        p = context.Process(
            target=_rank_main,
            args=(config, rank, init_method),
            name=f"outpace-rank-{rank}",
            daemon=True,
        )
        p.start()
        processes[rank] = p
    ranks = Ranks(processes=processes, owns_group=True)
    try:
        group = init_rank_group(
            config.world_size, 0, config.device, init_method, timeout_s=config.dist_timeout
        )
        ranks.group = engine_group(config, group)
    except BaseException:
        ranks.close(timeout_s=0.0)
        raise
    _started_here.add(id(ranks))
    return ranks


def _rank_main(config, rank: int, init_method: str) -> None:
    """A started rank's process: join the group, follow rank 0, exit 1 (naming why) if that fails."""
    group = None
    try:
        group = init_rank_group(
            config.world_size, rank, config.device, init_method, timeout_s=config.dist_timeout
        )
        group = engine_group(config, group)
        follow(config, group)
    except BaseException as e:  # rank 0 died or failed: leave, saying why
        failure = Ranks(group).failure(e) if group is not None else None
        print(
            f"outpace rank {rank}: stopping: {failure or f'{type(e).__name__}: {e}'}",
            file=sys.stderr,
        )
        sys.exit(1)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
