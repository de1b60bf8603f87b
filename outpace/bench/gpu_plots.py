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
            line, = ax.plot(batches, [x["tokens_per_s"] for x in rows], marker="o", label=f"outpace, context {context}")
            ax.plot(batches, [x["floor_steps_per_s"] * x["batch"] for x in rows], ls="--", color=line.get_color(),
                    label=f"bandwidth floor, context {context}")
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="decode tokens/s",
               title=f"Llama-3.1-8B shape, bf16, {r['device']}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "gpu_decode.png", dpi=110)
    if "verify_cost" in r:  # (c) verify forward relative to decode
        fig, ax = plt.subplots(figsize=(7, 4))
        shapes = sorted({(x["query_tokens"], x["tree"]) for x in r["verify_cost"]})
        batches = sorted({x["batch"] for x in r["verify_cost"]})
        width = 0.8 / len(shapes)
        for i, (q, tree) in enumerate(shapes):
            vals = [next(x["relative_to_decode"] for x in r["verify_cost"]
                         if x["batch"] == b and x["query_tokens"] == q and x["tree"] == tree) for b in batches]
            ax.bar([j + i * width for j in range(len(batches))], vals, width,
                   label=f"{q} tokens{' (tree)' if tree else ''}")
        ax.axhline(1.10, color="k", ls=":", lw=1, label="target for 6 tokens (1.10)")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
        ax.set(ylabel="forward time / decode forward", title="Verify cost, context 512")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "gpu_verify_cost.png", dpi=110)
    if "eagle3_oracle" in r:  # (d) speculation against plain decoding
        rows = r["eagle3_oracle"]["rows"]
        plain = {x["batch"]: x["tokens_per_s"] for x in r.get("decode", []) if x["context"] == 512}
        fig, ax = plt.subplots(figsize=(7, 4))
        batches = [x["batch"] for x in rows]
        ax.plot(batches, [x["tokens_per_s"] for x in rows], marker="o", label="EAGLE3 chain, 5 steps (ORACLE acceptance)")
        if plain:
            ax.plot(batches, [plain.get(b, float("nan")) for b in batches], marker="s", label="no speculation")
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens/s",
               title="8B shape, context 512; acceptance drawn from the zoo pair's rates")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "gpu_eagle3_oracle.png", dpi=110)
    if "zoo" in r:  # (f) each drafter against none
        fig, ax = plt.subplots(figsize=(8, 4))
        methods = [m for m in dict.fromkeys(x["method"] for x in r["zoo"]) if m != "none"]
        batches = sorted({x["batch"] for x in r["zoo"]})
        width = 0.8 / len(batches)
        for i, b in enumerate(batches):
            vals = [next(x["speedup"] for x in r["zoo"] if x["method"] == m and x["batch"] == b) for m in methods]
            ax.bar([j + i * width for j in range(len(methods))], vals, width, label=f"batch {b}")
        ax.axhline(1.0, color="k", lw=1)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(methods))], methods)
        ax.set(ylabel="tokens/s / --method none", title="Zoo models on the GPU (bf16), same run")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "gpu_zoo.png", dpi=110)
