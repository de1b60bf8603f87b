"""The end of every draft recipe: checkpoint (bf16, shards <= 15 MiB), config.json, loss plot,
training_metrics.json and the model card."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from outpace.checkpoint import save_checkpoint
from outpace.train.distill import device_name
from outpace.train.loop import TrainHistory, plot_history
from outpace.train.metrics_file import write_metrics

MAX_SHARD_BYTES = 15 * 1024 * 1024


def common_metrics(
    recipe,
    model: nn.Module,
    history: TrainHistory,
    started: float,
    device: str,
    num_ranks: int = 1,
    *,
    target: Path,
) -> dict:
    """What every recipe reports: its recipe, the target it trained against (as given on the command
    line), size, wall times, final loss, loss history, device and the number of training ranks (one device
    each)."""
    return dict(
        recipe=dataclasses.asdict(recipe),
        target=str(target),
        num_parameters=sum(p.numel() for p in model.parameters()),
        train_wall_seconds=history.wall_seconds,
        total_wall_seconds=time.perf_counter() - started,
        final_loss=history.losses[-1],
        history=history.to_dict(),
        device=device_name(device),
        training_ranks=num_ranks,
    )


def save_trained(
    out_dir: Path,
    tensors: dict[str, torch.Tensor],
    cfg_dict: dict,
    history: TrainHistory,
    plot_title: str,
    metrics: dict,
    write_card: Callable[[Path, dict], None],
    plotted_prefix: str | None = None,
) -> dict:
    """Write a trained model's directory; ``plotted_prefix`` keeps only those extra curves in the plot."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(
        {
            k: v if v.dtype in (torch.int64, torch.bool) else v.to(torch.bfloat16)
            for k, v in tensors.items()
        },
        out_dir,
        MAX_SHARD_BYTES,
    )
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    if plotted_prefix is not None:
        history = dataclasses.replace(
            history, extra={k: v for k, v in history.extra.items() if k.startswith(plotted_prefix)}
        )
    plot_history(history, out_dir / "loss.png", plot_title)
    write_metrics(out_dir, metrics)
    write_card(out_dir, metrics)
    return metrics
