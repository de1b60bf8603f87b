"""One training loop for every recipe (target, drafts): AdamW, warmup + cosine decay, bf16
autocast on GPU, gradient clipping, a progress bar with loss and tokens/s, a time budget, and a
loss history that becomes a PNG. Seeded: the same recipe on the same machine gives the same curve.
Resumable: given a ``Resume``, the run saves its state every few steps and starts from it when present.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from outpace.train.ranks import ONE_RANK, TrainRanks
from outpace.train.resume import Resume


@dataclass(frozen=True)
class OptimConfig:
    steps: int
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # A time budget: after ``calibration_steps`` steps the run is shortened to the number of steps
    # that fit (the cosine schedule follows the new length), and every ``replan_every`` steps after that
    # shortened again if the recent steps were slower (a GPU shared with other runs), so the budget holds;
    # reruns with a fixed ``steps`` and no budget reproduce a curve exactly.
    max_minutes: float | None = None
    calibration_steps: int = 30
    replan_every: int = 200

    def lr_at(self, step: int, total_steps: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, total_steps - self.warmup_steps))
        return self.lr * (
            self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        )


@dataclass
class TrainHistory:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    tokens_per_second: list[float] = field(
        default_factory=list
    )  # over the log interval ending at each logged step
    wall_seconds: float = 0.0
    tokens_seen: int = 0
    total_steps: int = 0
    resumed_from_step: int | None = (
        None  # the step the last process resumed at (None: it ran from step 0)
    )

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "losses": self.losses,
            "extra": self.extra,
            "tokens_per_second": self.tokens_per_second,
            "wall_seconds": self.wall_seconds,
            "tokens_seen": self.tokens_seen,
            "total_steps": self.total_steps,
            "resumed_from_step": self.resumed_from_step,
        }


# loss_fn(step) -> (loss to backprop, number of tokens in the batch, extra scalars to log); over several
# training ranks, the loss and the scalars are this rank's shares (they sum over the ranks to the value)
LossFn = Callable[[int], tuple[torch.Tensor, int, dict[str, float]]]


def train(
    model: nn.Module,
    loss_fn: LossFn,
    opt: OptimConfig,
    device: str,
    log_every: int = 10,
    desc: str = "training",
    resume: Resume | None = None,
    ranks: TrainRanks = ONE_RANK,
) -> TrainHistory:
    """Train ``model`` (over several ``ranks``: FSDP-sharded, train/ranks.py) on ``loss_fn``'s losses."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": opt.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=opt.lr,
        betas=(0.9, 0.95),
        fused=device.startswith("cuda"),
    )
    history = TrainHistory(total_steps=opt.steps)
    step = 0
    saved = resume.load(model, optimizer, ranks) if resume is not None else None
    if saved is not None:
        step, fields = saved
        history = TrainHistory(**{**fields, "resumed_from_step": step})
    use_autocast = device.startswith("cuda")
    start = (
        time.perf_counter() - history.wall_seconds
    )  # a resumed run counts the time already spent
    window_tokens, window_start = 0, time.perf_counter()
    model.train()
    bar = tqdm(
        total=history.total_steps,
        initial=step,
        desc=desc,
        mininterval=2.0,
        disable=not ranks.is_driver,
    )
    budget = None if opt.max_minutes is None else StepBudget(opt, start, first_step=step)
    while step < history.total_steps:
        if budget is not None and budget.due(step):
            _sync(device)
            history.total_steps = ranks.agree(budget.plan(step, history.total_steps))
            bar.total = history.total_steps
        for group in optimizer.param_groups:
            group["lr"] = opt.lr_at(step, history.total_steps)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
            loss, num_tokens, extra = loss_fn(step)
        optimizer.zero_grad(set_to_none=True)
        (
            loss * ranks.size
        ).backward()  # FSDP averages the ranks' gradients: the mean of size x shares
        torch.nn.utils.clip_grad_norm_(params, opt.grad_clip)
        optimizer.step()
        history.tokens_seen += num_tokens
        window_tokens += num_tokens
        if step % log_every == 0 or step == history.total_steps - 1:
            # one sync (and over several ranks one all-reduce) per log interval, not per step
            logged = ranks.total(
                torch.stack(
                    [
                        loss.detach().float(),
                        *(torch.as_tensor(v, device=loss.device).float() for v in extra.values()),
                    ]
                )
            ).tolist()
            value = logged[0]
            history.steps.append(step)
            history.losses.append(value)
            for k, v in zip(extra, logged[1:]):
                history.extra.setdefault(k, []).append(v)
            now = time.perf_counter()
            history.tokens_per_second.append(window_tokens / max(now - window_start, 1e-9))
            bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{history.tokens_per_second[-1]:,.0f}")
            window_tokens, window_start = 0, now
        bar.update(1)
        step += 1
        if resume is not None and step % resume.every == 0 and step < history.total_steps:
            history.wall_seconds = time.perf_counter() - start
            resume.save(step, model, optimizer, history, ranks)
    bar.close()
    history.wall_seconds = time.perf_counter() - start
    model.eval()
    return history


class StepBudget:
    """How many steps fit ``opt.max_minutes`` of wall time (counted from ``start``, which a resumed run
    sets back by the time already spent). The first plan times the steps of a window that opens a third of
    the way into ``calibration_steps`` after ``first_step``, the step this process starts at (start-up,
    allocator and kernel warm-up, a compiled step's compilation excluded: a resumed run warms up again),
    and closes ``calibration_steps`` after it; every ``replan_every`` steps after that, the last window's
    step time plans again. A plan only ever shortens the run (from ``opt.steps``, or a resumed run's planned
    length), so a machine that turns busier mid-run does not carry it past the budget."""

    def __init__(self, opt: OptimConfig, start: float, first_step: int = 0) -> None:
        self.opt, self.start = opt, start
        self.opens_at = first_step + opt.calibration_steps // 3
        self.mark: tuple[int, float] | None = None  # (step, time) where the current window opened
        self.window = opt.calibration_steps - opt.calibration_steps // 3

    def due(self, step: int) -> bool:
        """A window opens or closes at this step."""
        if self.mark is None:
            return step >= self.opens_at
        return step - self.mark[0] >= self.window

    def plan(self, step: int, total_steps: int) -> int:
        """The run's length after ``step`` steps (call when ``due``, after a device sync)."""
        now = time.perf_counter()
        if self.mark is not None:
            per_step = (now - self.mark[1]) / (step - self.mark[0])
            remaining = 60 * self.opt.max_minutes - (now - self.start)
            total_steps = min(total_steps, max(step + 1, step + int(remaining / per_step)))
            self.window = self.opt.replan_every
        self.mark = (step, now)
        return total_steps


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def plot_history(history: TrainHistory, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history.steps, history.losses, label="loss (total)")
    for name, values in history.extra.items():
        ax.plot(history.steps, values, label=name, alpha=0.8)
    ax.set_xlabel("step")
    # from scratch the first steps' loss is ~10x the last: on a linear axis the curves then lie flat at the bottom
    wide = bool(history.losses) and max(history.losses) > 4 * min(history.losses) > 0
    ax.set_yscale("log" if wide else "linear")
    ax.set_ylabel("cross-entropy (nats/token" + (", log scale)" if wide else ")"))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
