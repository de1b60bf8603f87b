"""Plot of closed-batch speed-ups (benchmarks/scripts/closed_batch_rounds.py's JSON): for each family and drafter, the
closed batch's median speed-up over plain decoding at each batch and temperature, and the steady state's, with plain
decoding's 1.0 drawn across (issue 43 item 7: no bar under it).

    python benchmarks/scripts/plot_closed_batches.py OUT.png "Qwen3.5=call3/qwen35.json" "DeepSeek=call4/deepseek.json" ...

Each argument is LABEL=FILE: the label is prefixed to every drafter of the file (plain decoding's rows are left out).
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def rows(spec: str) -> list[tuple[str, tuple[int, float], float, float]]:
    """(family and drafter, (batch, temperature), closed speed-up, steady speed-up) of one LABEL=FILE."""
    label, path = spec.split("=", 1)
    found = json.loads(Path(path).read_text())["rows"]
    return [
        (
            f"{label} {r['method']}",
            (r["batch"], r["temperature"]),
            r["closed_speedup"],
            r["steady_speedup"],
        )
        for r in found
        if r["method"] != "none"
    ]


def main(out: str, specs: list[str]) -> None:
    found = [row for spec in specs for row in rows(spec)]
    names = list(dict.fromkeys(name for name, *_ in found))
    cells = sorted({cell for _, cell, *_ in found})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    width = 0.8 / len(names)
    for ax, (column, title) in zip(
        axes, ((2, "closed batch (median of rounds)"), (3, "steady state"))
    ):
        for i, name in enumerate(names):
            values = {row[1]: row[column] for row in found if row[0] == name}
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(cells))]
            ax.bar(xs, [values.get(c, 0.0) for c in cells], width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(cells)), [f"batch {b}\nT {t}" for b, t in cells])
        ax.set_title(title)
    axes[0].set_ylabel("speed-up over plain decoding")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(names), 6))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
