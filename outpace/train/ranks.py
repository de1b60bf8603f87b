"""Draft training over several processes (torch.distributed): the target tensor-parallel over every
rank, the draft data-parallel with its weights and optimizer moments sharded by FSDP. The draft is a model
of its own (EAGLE3, DFlash, the standalone draft) or a part of the target (its MTP layers: ``whole`` gives
each rank an unsharded copy of that part, since tensor-parallel layers are built for serving, not training).

This is SpecForge's layout (scripts/train_eagle3.py: the target tensor-parallel, the draft wrapped in
FSDP): a target that does not fit one GPU is split as serving splits it (outpace/distributed/), and its
hidden states come from outpace's own sharded forward.

Each step every rank draws the same batch (one seeded generator), runs the sharded target over all of
it (tensor parallelism needs the same input on every rank), and then runs the draft over its own
``rows`` of the batch. A draft loss is a mean over the kept rows of the whole batch, so each rank
computes its *share* of it (its rows' sum over the count of all ranks' rows, ``total``): the shares add up
to the one-process loss. FSDP averages the ranks' gradients, so the loop backpropagates ``size``
times the share, and their mean is exactly the one-process gradient: the same recipe gives the same
curve at any number of ranks, up to float summation order (tests/train/test_train_ranks.py).

Engines (the data the target generates, the held-out evaluation) run on rank 0 as tensor-parallel
engines over the same ranks: ``on_driver(fn)`` runs ``fn`` on rank 0 while the other ranks serve the
engines it opens with ``open_llm`` (each announced to them first), then hands ``fn``'s result to every
rank.

Two ways in, as for serving: ``outpace train draft --nproc-per-node N`` starts ranks 1 .. N-1 itself
(torch.multiprocessing, a TCP rendezvous on localhost), or ``torchrun --nproc-per-node N -m outpace
train draft ...`` starts them all (env://, several machines alike; rank 0 prints the result).
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from outpace.distributed.collectives import all_reduce, broadcast_from_driver
from outpace.distributed.group import SINGLE, RankGroup, building_in, init_rank_group
from outpace.distributed.launch import (
    COLLECTIVE_TIMEOUT_S,
    exit_reason,
    follow,
    free_port,
    join_group,
    launched_by_torchrun,
)
from outpace.distributed.process_exit import leave_process

_ENGINES_DONE = "outpace: no more engines"


class RankFailed(RuntimeError):
    """Another rank of the training run failed; this one cannot go on."""


@dataclass(frozen=True)
class TrainRanks:
    group: RankGroup = SINGLE
    device: str = "cpu"

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def is_driver(self) -> bool:
        return self.group.is_driver

    # --- the batch and the loss -------------------------------------------------------------

    def rows(self, batch_size: int, what: str = "batch_size") -> slice:
        """This rank's rows of a batch every rank drew alike (``batch_size`` must split evenly)."""
        if batch_size % self.size:
            raise ValueError(
                f"{what}={batch_size} does not split over {self.size} training ranks: it must be a "
                f"multiple of {self.size}"
            )
        share = batch_size // self.size
        return slice(self.group.rank * share, (self.group.rank + 1) * share)

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks, detached, in float32 (the loss shares' sum is the loss; the rows'
        counts' sum is what a share divides by)."""
        return all_reduce(x.detach().float().clone(), self.group)

    def agree(self, value):
        """Rank 0's ``value`` on every rank (a step count each rank measured for itself)."""
        return broadcast_from_driver(value, self.group)

    # --- the models -------------------------------------------------------------------------

    def load_target(self, target_dir: Path, device: str) -> nn.Module:
        """The target, frozen, in the training precision (bf16 on the GPU, fp32 on the CPU): over several
        ranks this rank's tensor-parallel shard of it."""
        from outpace.models.loader import load_model

        with building_in(self.group):
            target = load_model(
                target_dir,
                torch.bfloat16 if device.startswith("cuda") else torch.float32,
                device,
                progress=False,
            )
        return target.requires_grad_(False)

    def shard(
        self, draft: nn.Module, step: Callable[..., object], compile_step: bool = False
    ) -> nn.Module:
        """``DraftStep(draft, step, compile_step)``, with FSDP over the ranks (its forward hooks gather the draft's
        weights around the whole step); as it is for one rank."""
        objective = DraftStep(draft, step, compile_step)
        if self.size == 1:
            return objective
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cuda" if self.device.startswith("cuda") else "cpu", (self.size,))
        return fully_shard(objective, mesh=mesh)

    def whole(self, target: nn.Module, part: str) -> nn.Module:
        """The target's submodule ``part`` (e.g. "mtp_layers") whole on this rank, to train data-parallel: the
        target's own for one rank; over several (the tensor-parallel target holds only a shard of it, and its
        collectives carry no gradient) a copy built unsharded and read from the target's checkpoint
        (models/loader.py ``load_part``)."""
        sharded = target.get_submodule(part)
        if self.size == 1:
            return sharded
        from outpace.models.loader import load_part

        param = next(sharded.parameters())
        return load_part(
            target.checkpoint_dir, part, param.dtype, str(param.device), buffers_from=sharded
        )

    def row_local(self, target: nn.Module) -> nn.Module:
        """The target as a draft calls it on this rank's own rows (its ``embed``, head and ``compute_logits``;
        models/drafts/mtp.py's layers take it as their ``target``): the target itself for one rank; over several, a
        ``RowLocalTarget`` over its whole embedding and head (``embedding``, ``head``)."""
        if self.size == 1:
            return target
        return RowLocalTarget(
            target, self.embedding(target, target.config.vocab_size), self.head(target)
        )

    def embedding(
        self, target: nn.Module, vocab_size: int
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The target's token embedding as a function each rank calls on its own rows: the target's own for
        one rank; over several (a sharded lookup is a collective that needs the same ids on every rank),
        its whole table, looked up once through the target (scaling included), indexed locally."""
        if self.size == 1:
            return target.embed
        device = next(target.parameters()).device
        with torch.no_grad():
            table = target.embed(torch.arange(vocab_size, device=device))  # [vocab, hidden]
        return lambda token_ids: F.embedding(token_ids, table)

    def head(self, target: nn.Module) -> nn.Module:
        """The target's head as a module each rank calls on its own rows: the target's own for one rank; over
        several (sharded logits are gathered over the ranks, which must hold the same rows), its whole weight
        gathered once into an unsharded head."""
        if self.size == 1:
            return target.lm_head
        from outpace.layers.embedding import LMHead

        weight = target.lm_head.full_weight()  # [vocab, hidden]
        head = LMHead(weight.shape[1], weight.shape[0]).to(weight.device)
        head.weight = nn.Parameter(weight, requires_grad=False)
        return head

    def full_parameters(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """name -> the whole parameter on every rank (FSDP shards gathered: a collective)."""
        return {
            name: p.full_tensor() if hasattr(p, "full_tensor") else p
            for name, p in module.named_parameters()
        }

    # --- engines ----------------------------------------------------------------------------

    def open_llm(self, model: str, progress: bool = False, **engine_kwargs):
        """An ``LLM`` of ``model`` tensor-parallel over this run's ranks (rank 0, inside ``on_driver``): its
        config goes to the other ranks first, which build the same engine and follow it until it closes."""
        from outpace import LLM
        from outpace.config import EngineConfig

        if self.size == 1:
            return LLM(model, progress=progress, **engine_kwargs)
        engine_kwargs = {**engine_kwargs, "tensor_parallel_size": self.size}
        broadcast_from_driver(EngineConfig(model=model, **engine_kwargs), self.group)
        return LLM(model, progress=progress, **engine_kwargs)

    def on_driver(self, fn: Callable[[], object]):
        """``fn()`` on rank 0 (its engines from ``open_llm``; the other ranks serve them meanwhile), and its
        result on every rank. A failure on rank 0 is raised on every rank."""
        if self.size == 1:
            return fn()
        if self.is_driver:
            try:
                result, failure = fn(), None
            except BaseException as e:
                result, failure = None, e
            broadcast_from_driver(_ENGINES_DONE, self.group)
            broadcast_from_driver(
                (result, None if failure is None else f"{type(failure).__name__}: {failure}"),
                self.group,
            )
            if failure is not None:
                raise failure
            return result
        self._serve_engines()
        result, failure = broadcast_from_driver(None, self.group)
        if failure is not None:
            raise RankFailed(f"training rank 0 failed: {failure}")
        return result

    def _serve_engines(self) -> None:
        """Ranks > 0: follow each engine rank 0 announces until it says there are no more."""
        while (config := broadcast_from_driver(None, self.group)) != _ENGINES_DONE:
            ranks = join_group(config)
            try:
                follow(config, ranks.group)
            finally:
                ranks.close()


class DraftStep(nn.Module):
    """A draft and the computation of one training step on it (``step(draft, *inputs)`` -> losses) as one
    module: FSDP gathers a module's weights around its forward, and this forward is all of the draft's work
    in a step (a recipe calls parts of the draft, not its forward).

    ``compile_step``: run ``step`` through ``torch.compile`` (static shapes: every batch of a recipe has one
    shape). A draft's step is hundreds of small, memory-bound kernels (softmaxes over the vocabulary per TTT
    step or block row, masked attention scores); compiled, they fuse.
    """

    def __init__(
        self, draft: nn.Module, step: Callable[..., object], compile_step: bool = False
    ) -> None:
        super().__init__()
        self.draft = draft
        self.step = torch.compile(step, dynamic=False) if compile_step else step

    def forward(self, *inputs):
        return self.step(self.draft, *inputs)


class RowLocalTarget:
    """A tensor-parallel target whose embedding and head each rank applies to its own rows: a sharded lookup
    or head is a collective over the same rows on every rank, so these are whole (``TrainRanks.embedding``,
    ``TrainRanks.head``); ``compute_logits`` is the target class's own, over this head; every other attribute
    is the target's (its final norm is replicated, not sharded)."""

    def __init__(
        self, target: nn.Module, embed: Callable[[torch.Tensor], torch.Tensor], head: nn.Module
    ) -> None:
        self._target, self.embed, self.lm_head = target, embed, head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] pre-norm -> [n, vocab] float32 logits."""
        return type(self._target).compute_logits(self, hidden)

    def __getattr__(self, name: str):
        return getattr(self._target, name)


ONE_RANK = TrainRanks()


def train_on_ranks(fn: Callable[..., dict], nproc: int, device: str, *args):
    """``fn(*args, ranks=...)`` on every rank of a training run; rank 0's result here (None on the other
    ranks of a torchrun launch). One rank and no launcher: a plain call."""
    if launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc not in (1, world):
            raise ValueError(
                f"--nproc-per-node {nproc} under torchrun, whose WORLD_SIZE is {world}: give torchrun's "
                "count only"
            )
        return _run_rank(
            fn,
            args,
            device,
            init_rank_group(world, int(os.environ["RANK"]), device, timeout_s=COLLECTIVE_TIMEOUT_S),
        )
    if nproc == 1:
        return fn(*args, ranks=TrainRanks(SINGLE, device))
    if nproc < 1:
        raise ValueError(f"--nproc-per-node {nproc}: must be >= 1")
    init_method = f"tcp://127.0.0.1:{free_port()}"
    context = mp.get_context("spawn")
    processes = [
        context.Process(
            target=_spawned_rank,
            args=(fn, args, device, nproc, rank, init_method),
            name=f"outpace-train-rank-{rank}",
            daemon=False,
        )
        for rank in range(1, nproc)
    ]
    for p in processes:
        p.start()
    try:
        result = _run_rank(
            fn, args, device, init_rank_group(nproc, 0, device, init_method, COLLECTIVE_TIMEOUT_S)
        )
    finally:
        for p in processes:
            p.join(60.0)
            if p.exitcode is None:
                p.terminate()
                p.join(5.0)
    failed = {p.name: exit_reason(p.exitcode) for p in processes if p.exitcode != 0}
    if failed:
        raise RankFailed(f"training ranks failed: {failed}")
    return result


def _run_rank(fn: Callable[..., dict], args: tuple, device: str, group: RankGroup):
    try:
        result = fn(*args, ranks=TrainRanks(group, device))
    finally:
        dist.destroy_process_group()
    return result if group.is_driver else None


def _spawned_rank(fn, args, device: str, nproc: int, rank: int, init_method: str) -> None:
    """A rank that ``train_on_ranks`` started: run, and exit 1 naming the error if the run fails.

    NOTE: a rank whose run is complete leaves with ``leave_process(0)`` (distributed/process_exit.py: streams
    flushed, then ``os._exit``), skipping the interpreter's teardown: its process group is destroyed and rank
    0 writes every file, so nothing is left to finalise, and once (CI,
    2026-11-27) that teardown aborted a finished rank ("terminate called without an active exception": a C++
    thread still joinable when destroyed), which failed a run that had completed. Skipping it would leave
    tqdm's default lock, a multiprocessing semaphore, unreleased (the resource tracker then warns of a leak), so
    the rank's progress bars take a thread lock instead: they all live in this one process."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    try:
        _run_rank(
            fn,
            args,
            device,
            init_rank_group(nproc, rank, device, init_method, COLLECTIVE_TIMEOUT_S),
        )
    except BaseException:
        print(f"outpace training rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr)
        sys.exit(1)
    leave_process(0)
