"""``bench multi``'s verdicts on issue 20's targets, its plot and its table, from the result dict alone."""

from __future__ import annotations

from pathlib import Path

# the data-parallel parts of a run (multi_gpu.py runs them, bench/dp_serve.py): part -> the drafter its servers run
DP_PARTS = {"dp": "none", "dp_eagle3": "eagle3"}
# the servers of a data-parallel level (bench/dp_serve.py) -> their bars' colour
DP_SERVERS = {"one_replica": "C0", "one_replica_own_process": "C1", "two_replicas": "C2"}


def _row(rows: list[dict], **match) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def targets(r: dict) -> dict:
    """Each target's figure and whether it is met (None: not measured in this run)."""
    out: dict = {}
    world = r.get("world", 2)
    tp, corr = r.get("tp_speed", {}), r.get("correctness", {})
    if corr:
        out["tp_equal_fp32"] = {
            "value": corr.get("all_tp_equal_fp32"),
            "met": corr.get("all_tp_equal_fp32"),
        }
        out["drafters_lossless_fp32"] = {
            "value": corr.get("all_lossless_fp32"),
            "met": corr.get("all_lossless_fp32"),
        }
        bf16 = [x["match_rate"] for x in corr.get("tp_equality", []) if x["dtype"] == "bfloat16"]
        out["bf16_match_rate_min"] = {"value": min(bf16) if bf16 else None, "met": None}
    if world > 1:
        big = _row(tp.get("decode", []), shape="70b", tp=world, batch=1)
        frac = big["fraction_of_floor"] if big else None
        out["tp2_70b_batch1_of_floor >= 0.8"] = {
            "value": frac,
            "met": None if frac is None else frac >= 0.8,
        }
        for batch in (1, 32):
            real = _row(tp.get("eagle3", []), method="eagle3", tp=world, batch=batch)
            value = real.get("speedup") if real else None
            out[f"eagle3_tp2_batch{batch}_speedup > 1 (real acceptance, 8B widened zoo)"] = {
                "value": value,
                "met": None if value is None else value > 1,
            }
            oracle = [
                o for o in tp.get("oracle", []) if o["shape"] == "70b" and o["batch"] == batch
            ]
            if oracle:
                out[f"eagle3_tp2_batch{batch}_70b ORACLE speedups"] = {
                    "value": {o["acceptance"]: round(o["speedup"], 3) for o in oracle},
                    "met": None,
                }
        for part, dp in _dp_parts(r):
            with_drafter = "" if part == "dp" else f" with {dp.get('drafter')}"
            ratio = dp.get("output_tokens_per_s_ratio")
            out[f"dp2_over_one{with_drafter} >= 1.9 (output tokens/s)"] = {
                "value": ratio,
                "met": None if ratio is None else ratio >= 1.9,
                "mode": dp.get("mode"),
            }
            own = dp.get("output_tokens_per_s_ratio_own_process")
            if own is not None:
                out[
                    f"dp2_over_one{with_drafter}, one replica with --engine-process (output tokens/s)"
                ] = {"value": own, "met": None}
            saturated = dp.get("saturated", {}).get("output_tokens_per_s_ratio")
            if saturated is not None:
                out[
                    f"dp2_over_one{with_drafter} at {dp['saturated']['streams']} streams (saturated, output "
                    "tokens/s)"
                ] = {"value": saturated, "met": None}
    return out


def _dp_parts(r: dict) -> list[tuple[str, dict]]:
    """(part, rows) of the data-parallel parts this run has (``dp``: plain decoding; ``dp_eagle3``)."""
    return [(part, r[part]) for part in DP_PARTS if r.get(part)]


def print_multi_gpu(r: dict) -> None:
    """The short table (printed last)."""
    print(
        f"\nbench multi: {r.get('device')} x{r.get('world')}, torch {r.get('torch')}, parts {', '.join(r['parts'])}"
    )
    if "copy_bandwidth_bytes_per_s" in r:
        print(f"copy bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s per device")
    corr = r.get("correctness")
    if corr:
        for x in corr["tp_equality"]:
            print(
                f"  TP={x['tp']} vs {x['reference']:<8} {x['model']:<12} {x['dtype']:<8} equal {str(x['equal']):<5} "
                f"match {x['match_rate']:.4f}"
            )
        print(
            "  lossless at TP=%s fp32: " % corr["tp"]
            + ", ".join(
                f"{x['target']} {x['drafter']} {'yes' if x['equal'] else 'NO'}"
                for x in corr["lossless"]
            )
        )
    tp = r.get("tp_speed")
    if tp:
        print(
            f"  {'shape':<6} {'TP':>2} {'batch':>5} {'tokens/s':>9} {'step ms':>8} {'floor t/s':>9} {'of floor':>8} "
            f"{'all-red ms':>10}"
        )
        for x in tp["decode"]:
            print(
                f"  {x['shape']:<6} {x['tp']:>2} {x['batch']:>5} {x['tokens_per_s']:>9.1f} {x['step_ms']:>8.2f} "
                f"{x['floor_tokens_per_s']:>9.1f} {x['fraction_of_floor']:>8.1%} "
                f"{1e3 * x['all_reduce_seconds']:>10.3f}"
            )
        for x in tp["eagle3"]:
            if x["method"] == "eagle3":
                print(
                    f"  EAGLE3 {x['shape']} TP={x['tp']} batch {x['batch']}: "
                    f"{x['steady_tokens_per_s']:.1f} tokens/s, "
                    f"{x.get('speedup', float('nan')):.2f}x plain, tau {x['tau'] or 1:.2f}, "
                    f"match {x.get('match_plain_greedy', float('nan')):.3f}"
                )
        for x in tp["oracle"]:
            print(
                f"  ORACLE EAGLE3 {x['shape']} TP={x['tp']} batch {x['batch']} a={x['acceptance']}: "
                f"k={x['num_drafts']} {x['speedup']:.2f}x (assumed acceptance, measured costs)"
            )
    for part, dp in _dp_parts(r):
        print(f"  {part}: served with {dp.get('drafter', '--method none')}")
        for level in (dp, dp.get("saturated", {})):
            for key in DP_SERVERS:
                if key in level:
                    s = level[key]
                    print(
                        f"  {level['streams']:>4} streams {key:<24} {s['requests_per_s']:.2f} requests/s, "
                        f"{s['output_tokens_per_s']:.1f} output tokens/s "
                        f"({s['num_requests'] - s['num_failed']}/{s['num_requests']} ok)"
                    )
        if "mode" in dp:
            print(f"  two replicas: {dp['mode']}")
    for text in r.get("not_run", []):
        print(f"  not run: {text}")
    for name, text in r.get("errors", {}).items():
        print(f"  ERROR {name}: {text}")
    for name, t in r.get("targets", {}).items():
        verdict = {True: "met", False: "NOT met", None: "-"}[t["met"]]
        print(f"  target {name}: {t['value']} ({verdict})")


def plot_multi_gpu(r: dict, path: Path) -> None:
    """Up to three panels, those of the parts measured: plain decode against the floor; EAGLE3 over plain (real
    and oracle); DP throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = r.get("tp_speed", {})
    decode = [
        (f"{x['shape']} TP{x['tp']} b{x['batch']}", x["fraction_of_floor"], "C0")
        for x in tp.get("decode", [])
    ]
    eagle3 = [
        (f"{x['shape'].split()[0]} TP{x['tp']} b{x['batch']} real", x.get("speedup", 0), "C0")
        for x in tp.get("eagle3", [])
        if x["method"] == "eagle3"
    ]
    eagle3 += [
        (
            f"{x['shape'].split()[0]} TP{x['tp']} b{x['batch']} ORACLE a={x['acceptance']}",
            x["speedup"],
            "C1",
        )
        for x in tp.get("oracle", [])
    ]
    dp = [
        (
            f"{part} {level['streams']} streams, {key.replace('_', ' ')}",
            level[key]["output_tokens_per_s"],
            DP_SERVERS[key],
        )
        for part, d in _dp_parts(r)
        for level in (d, d.get("saturated", {}))
        for key in DP_SERVERS
        if key in level
    ]
    # (bars, y label, title, a reference line (y, colour, label) or None, tick rotation, tick font size)
    panels = [
        p
        for p in (
            (
                decode,
                "decode tokens/s / floor",
                "plain decode vs the floor (bytes / copy bw + all-reduces)",
                (0.8, "red", "target 80% (70B, TP 2, batch 1)"),
                60,
                7,
            ),
            (
                eagle3,
                "tokens/s over plain decoding",
                "EAGLE3 (blue: real acceptance; orange: ORACLE)",
                (1.0, "black", None),
                70,
                6,
            ),
            (dp, "output tokens/s", "data parallel: one replica against two", None, 30, 6),
        )
        if p[0]
    ]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.5), squeeze=False)
    for ax, (bars, ylabel, title, line, rotation, fontsize) in zip(axes[0], panels):
        ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=rotation, fontsize=fontsize)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if line:
            ax.axhline(
                line[0],
                color=line[1],
                linewidth=0.8,
                linestyle="--" if line[2] else "-",
                label=line[2],
            )
            if line[2]:
                ax.legend(fontsize=7)
    fig.suptitle(f"outpace bench multi: {r.get('device')} x{r.get('world')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
