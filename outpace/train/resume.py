"""Resumable training: the state a run needs to go on after a stop (weights, optimizer moments, the step,
the loss history, the data sampler's generator), written every ``every`` steps and read back at start.

A run resumed from step s draws the same batches and takes the same steps as one that never stopped, so
on the CPU both give the same curve (tests/train/test_train.py checks it). A run over several training ranks
(train/ranks.py) keeps one file too: rank 0 writes the whole (FSDP-gathered) state and, on resuming,
hands each rank its shard (torch.distributed.checkpoint's full state dicts); it resumes over as many ranks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from outpace.train.ranks import ONE_RANK, TrainRanks
from outpace.train.run_checks import identity_mismatch


@dataclass
class Resume:
    path: Path  # the state file (written atomically: tmp file, then rename)
    every: int = 250  # steps between saves
    generator: torch.Generator | None = None  # the data sampler's generator, saved and restored
    # what the state belongs to (train/run_checks.py ``run_identity``: the recipe, target and fields), saved with
    # it; a state saved by another run is refused on loading, naming the file and the differences
    run: dict | None = None

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, ranks: TrainRanks = ONE_RANK
    ):
        """Restore the saved state into model, optimizer and generator: (step, history fields) or None."""
        if not ranks.agree(Path(self.path).is_file()):
            return None
        state = (
            torch.load(self.path, map_location="cpu", weights_only=False)
            if ranks.is_driver
            else None
        )
        mismatch = ranks.agree(self._mismatch(state) if state is not None else None)
        if mismatch:
            raise ValueError(
                f"{self.path} holds the training state of another run ({mismatch}): resume with the same "
                f"method, target and recipe, give another --out, or remove {Path(self.path).parent} to start "
                "again"
            )
        if ranks.size == 1:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        else:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            if ranks.agree(state.get("ranks") if state else None) != ranks.size:
                raise ValueError(
                    f"{self.path} was saved by a run over another number of ranks: resume it over as "
                    "many (--nproc-per-node), or remove the file to start again"
                )
            # rank 0 reads the file and hands each rank its shards (the others pass nothing); NOTE: separate calls,
            # as set_state_dict takes a rank with an empty model state for an optimizer-only load and skips it
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(model, state["model"] if state else {}, options=options)
            set_optimizer_state_dict(
                model, optimizer, state["optimizer"] if state else {}, options=options
            )
        step, history, generator = ranks.agree(
            (state["step"], state["history"], state["generator"]) if state else None
        )
        if self.generator is not None:
            self.generator.set_state(generator)
        return step, history

    def _mismatch(self, state: dict) -> str | None:
        if self.run is None:
            return None
        return identity_mismatch(state.get("run"), self.run)

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        history,
        ranks: TrainRanks = ONE_RANK,
    ) -> None:
        """Save the state after ``step`` steps (the next run starts at ``step``)."""
        if ranks.size == 1:
            weights, moments = model.state_dict(), optimizer.state_dict()
        else:  # gathered onto rank 0 (a collective)
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            weights, moments = get_state_dict(
                model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        if not ranks.is_driver:
            return
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "model": weights,
            "optimizer": moments,
            "history": dataclasses.asdict(history),
            "generator": self.generator.get_state() if self.generator is not None else None,
            "ranks": ranks.size,
            "run": self.run,
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
