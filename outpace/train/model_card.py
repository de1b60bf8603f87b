"""README.md for a trained zoo model, written from its training_metrics.json."""
from __future__ import annotations

import json
from pathlib import Path


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_model_card(model_dir: Path, title: str, summary: str, command: str, extra_sections: dict[str, str]) -> Path:
    model_dir = Path(model_dir)
    m = json.loads((model_dir / "training_metrics.json").read_text())
    recipe = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in m["recipe"].items())
    lines = [
        f"# {title}", "", summary, "",
        "## Reproduce", "", "```", command, "```", "",
        f"Trained on {m['device']} in {m['train_wall_seconds']:.0f} s of training "
        f"({m['total_wall_seconds']:.0f} s in all, data preparation and evaluation included); "
        f"{m['num_parameters']:,} parameters; weights stored in bf16.", "",
        "![loss](loss.png)", "",
        "## Recipe", "", "| field | value |", "|---|---|", recipe, "",
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
