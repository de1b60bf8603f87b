"""``outpace bench serve --sweep``: the served model under load from 1 to 64 concurrent streams, plain
decoding against speculation.

For each method (default none and eagle3; any of bench/e2e.py ``drafters``) ``outpace serve`` runs in
a child process (bench/local_server.py) on the target of ``model_dir`` (a folder in the zoo's layout:
``tinypy`` and its drafts; by default the zoo widened into the Llama-3.1-8B shape, bench/e2e.py
``widened_zoo``), with prefix caching on and the method's draft set up as the server does by default
(adaptive shapes; a tree keeps drafters()' topk). After untimed warm-up requests, each concurrency
level c sends ``max(min_requests, requests_per_concurrency * c)`` requests of a mix
(bench/request_mix.py: shared system-prompt prefixes, varied user parts and max_tokens, ``ignore_eos``
so that each request generates its max_tokens), c at a time, through bench serve's client
(server/bench.py ``run_load``). Per level: TTFT, ITL, TPOT and E2E percentiles, output tokens/s,
requests/s, tau from the responses' ``spec_metrics``, and the prefix-cache hit rate (the difference of
/metrics' prefix-cache counters over the level). Every method gets the same requests (seeded per level).
Writes ``serve_sweep.json`` (rows, config, device, versions; rewritten after each level),
``serve_sweep.png`` and each server's log (``serve_<method>.log``) into ``out_dir``, and prints a table.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from outpace.bench.e2e import ZOO_MODELS, drafters
from outpace.bench.local_server import ROOT, LocalServer
from outpace.bench.request_mix import PREFIX_CHARS, request_mix
from outpace.config import SpeculativeConfig
from outpace.server.bench import load_prompts, prefix_cache_hit_rate, run_load, scrape_metrics
from outpace.zoo import zoo_dir


@dataclass(frozen=True)
class SweepConfig:
    methods: tuple[str, ...] = ("none", "eagle3")
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    min_requests: int = 16
    requests_per_concurrency: int = 4
    max_tokens: tuple[int, int] = (32, 128)  # each request's, drawn uniformly
    prefix_chars: tuple[int, ...] = PREFIX_CHARS
    warmup_requests: int = 64  # at the highest concurrency, 8 to 16 tokens each
    temperature: float = 0.0
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    serve_args: tuple[str, ...] = ()  # more `outpace serve` flags, for every server
    chat: bool = False
    ready_timeout_s: float = 600.0

    def num_requests(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_concurrency * concurrency)


def serve_command(target: Path, spec: SpeculativeConfig, cfg: SweepConfig) -> list[str]:
    """``outpace serve`` arguments (host and port aside) for ``spec`` on ``target``."""
    args = [
        str(target),
        "--method",
        spec.method,
        "--device",
        cfg.device,
        "--dtype",
        cfg.dtype,
        "--enable-prefix-caching",
        "--max-num-seqs",
        str(max(cfg.concurrency)),
    ]
    if spec.draft:
        args += ["--draft", spec.draft]
    if spec.topk > 1:
        args += ["--topk", str(spec.topk)]
    return args + list(cfg.serve_args)


def run_serve_sweep(model_dir: Path, out_dir: Path, cfg: SweepConfig = SweepConfig()) -> dict:
    model_dir = model_dir.resolve()  # the servers run from the repository root
    specs = drafters({name: model_dir / name for name in ZOO_MODELS})
    unknown = [m for m in cfg.methods if m not in specs]
    if unknown:
        raise ValueError(f"unknown methods {unknown}: choose from {', '.join(specs)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(zoo_dir() / "eval_prompts.json")
    levels = {
        c: request_mix(
            prompts, cfg.num_requests(c), f"{cfg.seed}:{c}", cfg.max_tokens, cfg.prefix_chars
        )
        for c in cfg.concurrency
    }
    warmup = request_mix(
        prompts, cfg.warmup_requests, f"{cfg.seed}:warm-up", (8, 16), cfg.prefix_chars
    )
    result = {
        "config": {**asdict(cfg), "model_dir": str(model_dir)},
        "device": _device_name(cfg.device),
        "versions": _versions(),
        "servers": {},
        "rows": [],
    }
    for method in cfg.methods:
        args = serve_command(model_dir / "tinypy", specs[method], cfg)
        result["servers"][method] = shlex.join(["outpace", "serve", *args])
        t0 = time.perf_counter()
        log = out_dir / f"serve_{method}.log"
        with LocalServer(*args, log_path=log) as server:
            server.wait_ready(cfg.ready_timeout_s)
            print(
                f"{method}: server ready in {time.perf_counter() - t0:.0f} s; warm-up", flush=True
            )
            served(
                run_load(
                    server.url,
                    warmup,
                    max(cfg.concurrency),
                    cfg.temperature,
                    chat=cfg.chat,
                    ignore_eos=True,
                ),
                method,
                log,
            )
            for c in cfg.concurrency:
                before = scrape_metrics(server.url)
                row = served(
                    run_load(
                        server.url, levels[c], c, cfg.temperature, chat=cfg.chat, ignore_eos=True
                    ),
                    method,
                    log,
                )
                server.check_alive()
                row = {
                    "method": method,
                    **row,
                    "prefix_cache_hit_rate": prefix_cache_hit_rate(
                        before, scrape_metrics(server.url)
                    ),
                }
                result["rows"].append(row)
                print(_progress(row), flush=True)
                _write(result, out_dir)
    _write(result, out_dir)
    plot_sweep(result, out_dir / "serve_sweep.png")
    print(format_table(result))
    return result


class NothingServed(RuntimeError):
    """A server of the sweep answered every request of a load level with an error."""


def served(level: dict, method: str, log: Path) -> dict:
    """``level`` (``run_load``'s figures), unless every request of it failed: then ``NothingServed`` with their
    errors and the server's log, where a sweep of nothing served would end in a plot of no figures."""
    if level["num_requests"] and level["num_failed"] == level["num_requests"]:
        raise NothingServed(
            f"{method}: every request failed ({'; '.join(level['errors'])}); the server's log: {log}"
        )
    return level


def _write(result: dict, out_dir: Path) -> None:
    base = {
        r["concurrency"]: r["output_tokens_per_s"] for r in result["rows"] if r["method"] == "none"
    }
    for r in result["rows"]:  # output tokens/s over plain decoding's at the same concurrency
        r["speedup"] = (
            r["output_tokens_per_s"] / base[r["concurrency"]]
            if base.get(r["concurrency"])
            else None
        )
    (out_dir / "serve_sweep.json").write_text(json.dumps(result, indent=1) + "\n")


def _device_name(device: str) -> str:
    if device != "cpu":
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if smi.returncode == 0 and smi.stdout.strip():
                return smi.stdout.splitlines()[0].strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return f"cpu ({platform.processor() or platform.machine()})"


def _versions() -> dict:
    import torch

    from outpace import __version__

    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "outpace": __version__,
        "commit": git.stdout.strip() or None,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def _ms(p: dict, q: str) -> float:
    return float("nan") if p[q] is None else 1e3 * p[q]


def _progress(r: dict) -> str:
    tau = f", tau {r['tau']:.2f}" if r["tau"] else ""
    hit = (
        f", prefix-cache hits {r['prefix_cache_hit_rate']:.0%}"
        if r["prefix_cache_hit_rate"] is not None
        else ""
    )
    failed = f", {r['num_failed']} FAILED: {'; '.join(r['errors'])}" if r["num_failed"] else ""
    return (
        f"  {r['method']} c={r['concurrency']}: {r['num_requests']} requests in {r['wall_s']:.1f} s, "
        f"{r['output_tokens_per_s']:.0f} tokens/s, TTFT p50 {_ms(r['ttft_s'], 'p50'):.0f} ms{tau}{hit}{failed}"
    )


def format_table(result: dict) -> str:
    lines = [
        f"{'method':<12} {'conc':>4} {'tok/s':>8} {'vs none':>7} {'TTFT ms p50':>11} {'p99':>7} "
        f"{'ITL ms p50':>10} {'p99':>6} {'TPOT ms p50':>11} {'E2E s p50':>9} {'p99':>6} {'tau':>5} {'hits':>5}"
    ]
    for r in result["rows"]:
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        hits = (
            f"{r['prefix_cache_hit_rate']:.0%}" if r["prefix_cache_hit_rate"] is not None else "-"
        )
        lines.append(
            f"{r['method']:<12} {r['concurrency']:>4} {r['output_tokens_per_s']:>8.1f} {speedup:>7} "
            f"{_ms(r['ttft_s'], 'p50'):>11.1f} {_ms(r['ttft_s'], 'p99'):>7.1f} {_ms(r['itl_s'], 'p50'):>10.1f} "
            f"{_ms(r['itl_s'], 'p99'):>6.1f} {_ms(r['tpot_s'], 'p50'):>11.1f} {r['e2e_s']['p50']:>9.2f} "
            f"{r['e2e_s']['p99']:>6.2f} {r['tau'] or 1.0:>5.2f} {hits:>5}"
        )
    return "\n".join(lines)


def plot_sweep(result: dict, path: Path) -> None:
    """Four panels against concurrency, one line per method: output tokens/s; TTFT p50 and p99; ITL and
    TPOT p50; speed-up over plain decoding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (tput, ttft), (itl, speedup) = axes
    for method in dict.fromkeys(r["method"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["method"] == method]
        cs = [r["concurrency"] for r in rows]
        line = tput.plot(cs, [r["output_tokens_per_s"] for r in rows], marker="o", label=method)[0]
        color = line.get_color()
        ttft.plot(
            cs,
            [_ms(r["ttft_s"], "p50") for r in rows],
            marker="o",
            color=color,
            label=f"{method} p50",
        )
        ttft.plot(
            cs,
            [_ms(r["ttft_s"], "p99") for r in rows],
            marker="x",
            color=color,
            linestyle="--",
            label=f"{method} p99",
        )
        itl.plot(
            cs,
            [_ms(r["itl_s"], "p50") for r in rows],
            marker="o",
            color=color,
            label=f"{method} ITL p50",
        )
        itl.plot(
            cs,
            [_ms(r["tpot_s"], "p50") for r in rows],
            marker="x",
            color=color,
            linestyle=":",
            label=f"{method} TPOT p50",
        )
        if method != "none":
            speedup.plot(
                cs,
                [r["speedup"] or float("nan") for r in rows],
                marker="o",
                color=color,
                label=method,
            )
    speedup.axhline(1.0, color="black", linewidth=0.8)
    for ax, title, ylabel in (
        (tput, "output throughput", "tokens/s"),
        (ttft, "time to first token", "ms"),
        (itl, "inter-token latency (a chunk per step) and time per output token", "ms"),
        (speedup, "speculation over plain decoding", "output tokens/s ratio"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    ttft.set_yscale("log")
    fig.suptitle(
        f"outpace bench serve --sweep: {Path(result['config']['model_dir']).name}, {result['device']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
