"""Resumable training: the state a run needs to go on after a stop (weights, optimizer moments, the step,
the loss history, the data sampler's generator), written every ``every`` steps and read back at start.

A run resumed from step s draws the same batches and takes the same steps as one that never stopped, so
on the CPU both give the same curve (tests/test_train.py checks it).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class Resume:
    path: Path                                   # the state file (written atomically: tmp file, then rename)
    every: int = 250                             # steps between saves
    generator: torch.Generator | None = None     # the data sampler's generator, saved and restored

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        """Restore the saved state into model, optimizer and generator: (step, history fields) or None."""
        if not Path(self.path).is_file():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        return state["step"], state["history"]

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, history) -> None:
        """Save the state after ``step`` steps (the next run starts at ``step``)."""
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "history": dataclasses.asdict(history),
                 "generator": self.generator.get_state() if self.generator is not None else None}
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
