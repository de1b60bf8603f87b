"""training_metrics.json, as every recipe and the zoo's target trainer write it."""

from __future__ import annotations

import json
from pathlib import Path


def _curves_rounded(value):
    """``value`` with the floats inside its lists (loss curves, rates) to 5 significant digits; other figures
    unchanged."""
    if isinstance(value, dict):
        return {k: _curves_rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [float(f"{x:.5g}") if isinstance(x, float) else _curves_rounded(x) for x in value]
    return value


def write_metrics(out_dir: Path, metrics: dict) -> None:
    """``out_dir``/training_metrics.json. A curve's digits past the fifth are noise, and at 16 digits a ten-minute
    run's curves took most of its draft's 0.33 MiB of metrics, in a zoo with a size budget."""
    (Path(out_dir) / "training_metrics.json").write_text(
        json.dumps(_curves_rounded(metrics), indent=2) + "\n"
    )
