"""Plot of benchmarks/results/closed_loop_h200/: one replica's output tokens/s under 64 streams (benchmarks/scripts/diag_closed_loop.py),
plain decoding and adaptive EAGLE3, with equal and with spread output lengths, for each run folder in it.

  python benchmarks/scripts/plot_closed_loop.py [benchmarks/results/closed_loop_h200]
"""

import gzip
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def result(run: Path, method: str, spread: str) -> Path:
    """A run's JSON for one method and load (gzipped in the repository to keep the tree small)."""
    return run / f"closed_loop_{method}_spread{spread}.json.gz"


def main(folder: Path) -> None:
    loads = (("0", "equal lengths"), ("0.5", "lengths spread 0.5"))
    runs = sorted(
        p
        for p in folder.iterdir()  # (runs of every load and method)
        if p.is_dir()
        and all(result(p, m, s).is_file() for s, _ in loads for m in ("none", "eagle3"))
    )
    fig, axes = plt.subplots(1, len(loads), figsize=(10, 4), sharey=True)
    width = 0.8 / len(runs)
    for ax, (spread, title) in zip(axes, loads):
        for i, run in enumerate(runs):
            rates = [
                json.loads(gzip.decompress(result(run, m, spread).read_bytes()))[
                    "output_tokens_per_s"
                ]
                for m in ("none", "eagle3")
            ]
            bars = ax.bar([x + i * width for x in range(2)], rates, width, label=run.name)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(
            [x + width * (len(runs) - 1) / 2 for x in range(2)], ["plain", "EAGLE3 (adaptive)"]
        )
        ax.set(title=title, ylabel="output tokens/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "One replica, zoo widened to 8B, 64 streams, H200: before and after 4ea5060 (run-ahead across joins, several prefill chunks captured)"
    )
    fig.tight_layout()
    fig.savefig(folder / "closed_loop.png", dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/closed_loop_h200"))
