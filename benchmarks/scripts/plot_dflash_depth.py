"""Plot of benchmarks/results/train_dflash_depth/runs.json: held-out tau (CPU, fp32) of each DFlash run against its
number of layers, one line per data temperature, at T = 0 and T = 1; runs whose data differs otherwise (half corpus
windows, twice the continuations, 8 and 10 layers with fewer k/v heads) are single labelled points.

  python benchmarks/scripts/plot_dflash_depth.py [benchmarks/results/train_dflash_depth]
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(folder: Path) -> None:
    runs = json.loads((folder / "runs.json").read_text())
    # the study's data: continuations only, 49152 of them; the others are drawn as points of their own
    main_runs = {
        k: r
        for k, r in runs.items()
        if r["corpus_fraction"] == 0 and r["num_continuations"] == 49152
    }
    other_runs = {k: r for k, r in runs.items() if k not in main_runs}
    fig, axes = plt.subplots(1, 2, figsize=(11, 6.5), sharex=True)
    for ax, key in zip(axes, ("tau T=0", "tau T=1")):
        for temp in sorted({r["data_temperature"] for r in main_runs.values()}):
            rows = sorted(
                (r["num_layers"], r["cpu_fp32_heldout"][key], r["total_minutes"])
                for r in main_runs.values()
                if r["data_temperature"] == temp
            )
            ax.plot(
                [x for x, _, _ in rows],
                [y for _, y, _ in rows],
                marker="o",
                label=f"data at T = {temp}",
            )
            for x, y, minutes in rows:
                ax.annotate(
                    f"{minutes:g} min",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=7,
                )
        for r in other_runs.values():
            what = (
                f"T = {r['data_temperature']:g}, {r['num_continuations']} cont."
                + (f" + {r['corpus_fraction']:g} corpus windows" if r["corpus_fraction"] else "")
                + (
                    f"; x {r['intermediate_size']}, {r['num_key_value_heads']} kv heads"
                    if r.get("num_key_value_heads")
                    else ""
                )
                + (f", {r['num_anchors']} anchors" if r.get("num_anchors", 64) != 64 else "")
            )
            ax.plot(
                r["num_layers"],
                r["cpu_fp32_heldout"][key],
                marker="*",
                markersize=10,
                linestyle="",
                label=what,
            )
        ax.set(
            xlabel="draft layers (intermediate 640 / 256 / 128 at 2 / 4 / 6)",
            ylabel=f"held-out {key}",
            title=f"serving at {key.split()[1]}",
        )
        ax.set_xticks(sorted({r["num_layers"] for r in runs.values()}))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle(
        "DFlash block 8 on the zoo target: depth and data temperature (whole-run budget per point)"
    )
    fig.tight_layout(rect=(0, 0.24, 1, 1))
    fig.savefig(folder / "tau.png", dpi=110)


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[1] / "results" / "train_dflash_depth"
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
