"""Plots of ``outpace bench gpu`` (one PNG per part that ran)."""

from __future__ import annotations

from pathlib import Path


def plot_gpu_bench(r: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "decode" in r:  # (b) tokens/s against batch size, with the floor
        fig, ax = plt.subplots(figsize=(7, 4))
        for context in sorted({x["context"] for x in r["decode"]}):
            rows = [x for x in r["decode"] if x["context"] == context]
            batches = [x["batch"] for x in rows]
            (line,) = ax.plot(
                batches,
                [x["tokens_per_s"] for x in rows],
                marker="o",
                label=f"outpace, context {context}",
            )
            ax.plot(
                batches,
                [x["floor_steps_per_s"] * x["batch"] for x in rows],
                ls="--",
                color=line.get_color(),
                label=f"bandwidth floor, context {context}",
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="batch size",
            ylabel="decode tokens/s",
            title=f"Llama-3.1-8B shape, bf16, {r['device']}",
        )
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "gpu_decode.png", dpi=110)
    if "zoo" in r:  # (f) each drafter against none
        fig, ax = plt.subplots(figsize=(8, 4))
        methods = [m for m in dict.fromkeys(x["method"] for x in r["zoo"]) if m != "none"]
        batches = sorted({x["batch"] for x in r["zoo"]})
        width = 0.8 / len(batches)
        for i, b in enumerate(batches):
            vals = [
                next(x["speedup"] for x in r["zoo"] if x["method"] == m and x["batch"] == b)
                for m in methods
            ]
            ax.bar([j + i * width for j in range(len(methods))], vals, width, label=f"batch {b}")
        ax.axhline(1.0, color="k", lw=1)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(methods))], methods)
        ax.set(ylabel="tokens/s / --method none", title="Zoo models on the GPU (bf16), same run")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "gpu_zoo.png", dpi=110)
