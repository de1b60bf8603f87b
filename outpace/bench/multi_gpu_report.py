"""``bench multi``'s verdicts on issue 20's and issue 46's targets, its plot and its table, from the result
dict alone."""

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
    if world > 1 and tp:
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
    if world > 1:
        out.update(_item1_targets(r.get("item1", {}), world))
        out.update(_seed_targets(r.get("qwen3next80b", {}), f"qwen3next80b TP = {world}"))
        for name, shape in _ep_shapes(r):
            out.update(_seed_targets(shape, f"ep {name} EP = TP = {world}"))
        out.update(_seed_targets(r.get("step35flash", {}), f"step35flash EP = TP = {world}"))
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


def _item1_targets(item1: dict, world: int) -> dict:
    """Issue 46 item 1: one graph replay per decode step, NCCL inside the graphs, the hybrids at TP = world."""
    out: dict = {}
    graphs = [g for g in item1.get("graphs", []) if g["tp"] == world]
    if graphs:
        out[f"item1 one graph replay of its bucket per decode step, TP = {world}"] = {
            "value": {f"batch {g['batch']}": g["replays_by_bucket"] for g in graphs},
            "met": all(g["one_replay_per_step"] for g in graphs),
        }
        out[f"item1 decode steps run eagerly, TP = {world}"] = {
            "value": sum(g["eager_steps"] for g in graphs),
            "met": all(g["eager_steps"] == 0 for g in graphs),
        }
    for nccl in item1.get("nccl", []):
        out[f"item1 NCCL kernels launched by graph launches only, TP = {nccl['tp']}"] = {
            "value": nccl["by_launch"],
            "met": nccl["all_in_graphs"],
        }
    if item1.get("tp_equality"):
        out["item1 hybrids fp32 TP = world equal to TP = 1"] = {
            "value": item1.get("all_tp_equal_fp32"),
            "met": item1.get("all_tp_equal_fp32"),
        }
        bf16 = [x["match_rate"] for x in item1["tp_equality"] if x["dtype"] == "bfloat16"]
        out["item1 hybrids bf16 match rate min"] = {
            "value": min(bf16) if bf16 else None,
            "met": None,
        }
    if item1.get("lossless"):
        out["item1 hybrid drafters lossless fp32"] = {
            "value": item1.get("all_lossless_fp32"),
            "met": item1.get("all_lossless_fp32"),
        }
    return out


def _seed_targets(seed: dict, label: str) -> dict:
    """Issue 46 items 2 and 3 (``label`` names the shape and its parallelism): plain decode at batch 1 against
    the floor; its MTP under ORACLE acceptance."""
    out: dict = {}
    one = _row(seed.get("decode", []), batch=1)
    if one:
        frac = one["fraction_of_floor"]
        out[f"{label} batch 1 of floor >= 0.75"] = {
            "value": frac,
            "met": frac >= 0.75,
        }
    for batch in (1, 32):
        oracle = [o for o in seed.get("oracle", []) if o["batch"] == batch]
        if oracle:
            out[f"{label} MTP batch {batch} ORACLE speedups"] = {
                "value": {o["acceptance"]: round(o["speedup"], 3) for o in oracle},
                "met": None,
            }
    return out


def _ep_shapes(r: dict) -> list[tuple[str, dict]]:
    """(name, section) of each shape the ``ep`` part measured."""
    return list(r.get("ep", {}).get("shapes", {}).items())


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
    _print_item1(r.get("item1"))
    _print_seed(r.get("qwen3next80b"), "qwen3next80b")
    for name, shape in _ep_shapes(r):
        _print_seed(shape, f"ep {name}, EP = {shape['ep']},")
    step = r.get("step35flash")
    _print_seed(step, f"step35flash (block FP8), EP = {step and step['ep']}")
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


GiB = 1 << 30


def _print_item1(item1: dict | None) -> None:
    if not item1:
        return
    print(
        "  item1: captured decode steps (replays over the timed steps, by bucket) and memory per rank"
    )
    for g in item1["graphs"]:
        print(
            f"  {g['shape']:<6} TP={g['tp']} batch {g['batch']:>3}: {g['decode_steps']} steps, replays "
            f"{g['replays_by_bucket']}, eager {g['eager_steps']}, one per step "
            f"{'yes' if g['one_replay_per_step'] else 'NO'}, {g['tokens_per_s']:.1f} tokens/s"
        )
    for x in item1["nccl"]:
        print(
            f"  TP={x['tp']} batch {x['batch']}: {x['count']} NCCL kernels over "
            f"{x['profiled_steps']} steps, by launch {x['by_launch']}, "
            f"{x['graph_launches']} graph launches"
        )
    for m in item1["memory"]:
        for rank in m["ranks"]:
            free = rank.get("free_bytes")
            print(
                f"  {m['shape']:<6} TP={m['tp']} rank {rank['rank']}: weights "
                f"{rank['weight_bytes'] / GiB:.2f} GiB, {rank['kv_blocks']} KV blocks of "
                f"{rank['block_size']} ({rank['blocks_fitting_this_rank']} fit this rank), free after start-up "
                f"{'-' if free is None else f'{free / GiB:.2f} GiB'}"
            )
    for x in item1["tp_equality"]:
        print(
            f"  TP={x['tp']} vs {x['reference']:<8} {x['model']:<18} {x['dtype']:<8} equal "
            f"{str(x['equal']):<5} match {x['match_rate']:.4f}"
        )
    if item1["lossless"]:
        print(
            "  lossless at TP=%s fp32: " % item1["tp"]
            + ", ".join(
                f"{x['target']} {x['drafter']} {'yes' if x['equal'] else 'NO'} (tau {x['tau'] or 1:.2f}"
                + (
                    f", plain's top-2 log-prob gap at the first difference {x['plain_top2_gap']:.2e})"
                    if x.get("plain_top2_gap") is not None
                    else ")"
                )
                for x in item1["lossless"]
            )
        )


def _print_seed(seed: dict | None, label: str) -> None:
    if not seed:
        return
    print(f"  {label}: {seed['model']}, TP = {seed['tp']}; {seed['weights']}")
    for e in seed["engines"]:
        weights = ", ".join(f"{x['weight_bytes'] / GiB:.1f}" for x in e["ranks"])
        host = ", ".join(f"{x['host_peak_rss_bytes'] / GiB:.1f}" for x in e["ranks"])
        print(
            f"  {e['engine']} engine built in {e['build_s']:.0f} s, weights per rank {weights} GiB, "
            f"host peak RSS per rank {host} GiB"
        )
        q = e.get("quantized")
        if q and q["quantized_bytes"]:
            print(
                f"    rank 0 quantized: {q['projections']} projections, {q['expert_stacks']} expert stacks, "
                f"{q['quantized_bytes'] / GiB:.1f} of {q['total_bytes'] / GiB:.1f} GiB; high precision: "
                f"{', '.join(q['high_precision_linears']) or 'no projection'}"
            )
    for x in seed["all_reduce"]:
        print(
            f"  all-reduces of one step alone: {x['all_reduces']} of [{x['batch']}, {x['hidden']}] "
            f"in {1e3 * x['seconds']:.3f} ms ({x['timed']})"
        )
    for x in seed["decode"]:
        print(
            f"  batch {x['batch']:>3}: {x['tokens_per_s']:>9.1f} tokens/s, step {x['step_ms']:.2f} ms, "
            f"floor {x['floor_tokens_per_s']:.1f} ({x['floor_bytes_per_gpu'] / 1e9:.2f} GB per GPU, "
            f"{x['expected_distinct_experts']:.1f} experts a layer), {x['fraction_of_floor']:.1%} of it"
        )
    for x in seed["oracle"]:
        print(
            f"  ORACLE MTP batch {x['batch']} a={x['acceptance']}: k={x['num_drafts']} "
            f"{x['speedup']:.2f}x, {x['tokens_per_s']:.0f} tokens/s (assumed acceptance, measured costs "
            f"{', '.join(f'{k}: {v:.2f}' for k, v in x['step_ms'].items())} ms)"
        )


def plot_multi_gpu(r: dict, path: Path) -> None:
    """Up to three panels, those of the parts measured: plain decode against the floor; EAGLE3 over plain (real
    and oracle); DP throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = r.get("tp_speed", {})
    seeds = [r.get("qwen3next80b", {}), r.get("step35flash", {})]
    seeds += [shape for _, shape in _ep_shapes(r)]
    decode = [
        (
            f"{x['shape']} {'EP' if x.get('ep', 1) > 1 else 'TP'}{x['tp']} b{x['batch']}",
            x["fraction_of_floor"],
            "C0",
        )
        for x in tp.get("decode", []) + [x for seed in seeds for x in seed.get("decode", [])]
    ]
    eagle3 = [
        (f"{x['shape'].split()[0]} TP{x['tp']} b{x['batch']} real", x.get("speedup", 0), "C0")
        for x in tp.get("eagle3", [])
        if x["method"] == "eagle3"
    ]
    eagle3 += [
        (
            f"{x['shape'].split()[0]} {x['method']} TP{x['tp']} b{x['batch']} ORACLE a={x['acceptance']}",
            x["speedup"],
            "C1",
        )
        for x in tp.get("oracle", []) + [x for seed in seeds for x in seed.get("oracle", [])]
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
                "speculation (blue: real acceptance; orange: ORACLE)",
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
