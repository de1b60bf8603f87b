"""README.md for a trained zoo model, written from its training_metrics.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

# Recipe fields that `outpace train draft` takes as flags of their own (cli/train.py); any other goes through --set.
_DRAFT_FLAGS = {
    "steps": "--steps",
    "max_minutes": "--max-minutes",
    "seed": "--seed",
    "num_continuations": "--num-continuations",
    "eval_prompts": "--eval-prompts",
}


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_model_card(
    model_dir: Path, title: str, summary: str, command: str, extra_sections: dict[str, str]
) -> Path:
    model_dir = Path(model_dir)
    m = json.loads((model_dir / "training_metrics.json").read_text())
    recipe = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in m["recipe"].items())
    lines = [
        f"# {title}",
        "",
        summary,
        "",
        "## Reproduce",
        "",
        "```",
        command,
        "```",
        "",
        f"Trained on {_devices(m)} in {m['train_wall_seconds']:.0f} s of training ({_whole_run(m)}); "
        f"{m['num_parameters']:,} parameters; weights stored in bf16.",
        "",
        "![loss](loss.png)",
        "",
        "## Recipe",
        "",
        "| field | value |",
        "|---|---|",
        recipe,
        "",
    ]
    for heading, body in extra_sections.items():
        lines += [f"## {heading}", "", body.strip(), ""]
    if m.get("samples"):
        lines += ["## Held-out completions (greedy, 64 tokens, outpace's engine)", ""]
        for s in m["samples"]:
            lines += ["```python", s["prompt"] + "⟦" + s["completion"] + "⟧", "```", ""]
        lines += ["The prompt is followed by the completion between ⟦ ⟧.", ""]
    path = model_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


def shown_target(target: str) -> str:
    """A run's target as a card names it: a zoo model as ``zoo/<name>`` (the CLI's default target is the
    zoo's absolute path), any other directory as it was given."""
    from outpace.zoo import zoo_dir

    try:
        return f"zoo/{Path(target).resolve().relative_to(zoo_dir().resolve())}"
    except (FileNotFoundError, ValueError):  # no zoo here, or a directory outside it
        return target


def draft_train_command(method: str, recipe_cls, m: dict, out: str) -> str:
    """The ``outpace train draft`` command of a run (``m``: its training metrics): its target, and every recipe
    field whose value differs from ``recipe_cls``'s default, as its own flag (``_DRAFT_FLAGS``, ``--data``) or
    ``--set``."""
    defaults = json.loads(
        json.dumps(dataclasses.asdict(recipe_cls()))
    )  # (tuples as lists, as the metrics hold them)
    parts = [
        f"python -m outpace train draft --method {method} --target {shown_target(m['target'])} --out {out}",
        "--device " + ("cpu" if m["device"] == "cpu" else "cuda"),
    ]
    for name, value in m["recipe"].items():
        if value == defaults[name]:
            continue
        if name == "prompt_files" and value:
            parts.append("--data " + " ".join(value))
        elif name in _DRAFT_FLAGS and value is not None:
            parts.append(f"{_DRAFT_FLAGS[name]} {value}")
        else:
            parts.append(f"--set {name}={json.dumps(value, separators=(',', ':'))}")
    if m.get("training_ranks", 1) > 1:
        parts.append(f"--nproc-per-node {m['training_ranks']}")
    return " ".join(parts)


def _whole_run(m: dict) -> str:
    """The run's whole wall time; a resumed run's is only its last process's (earlier processes' data
    preparation is not on its clock), and the card says so."""
    resumed = m.get("history", {}).get("resumed_from_step")
    if resumed is None:
        return f"{m['total_wall_seconds']:.0f} s in all, data preparation and evaluation included"
    return (
        f"resumed at step {resumed}: its last process took {m['total_wall_seconds']:.0f} s in all, evaluation "
        "included; the training seconds count every process's loop"
    )


def _devices(m: dict) -> str:
    """Where a run trained: its device, or N x it over N training ranks (metrics without the count: one)."""
    n = m.get("training_ranks", 1)
    return m["device"] if n == 1 else f"{n} x {m['device']} ({n} training ranks)"
