"""``outpace bench e2e``: every drafter end to end on the 8B shape with real acceptance, in one run.

The zoo target and its drafts are widened into the Llama-3.1-8B shape (bench/widen.py: zero padding
that keeps the function, so the drafts keep their acceptance and the target costs what an 8B model
costs). For plain decoding and every drafter, bf16 on the GPU through the public API, CUDA graphs
and adaptive speculation as served (``SpeculativeConfig`` without a fixed shape), at batch 1, 8 and
32 and temperature 0 and 0.8: tokens/s against plain decoding at the same batch and temperature,
τ, the draft shapes the steps chose, and at temperature 0 the greedy match rate (tokens equal to
the widened target's own plain greedy output, and to the zoo target's).

Rows run ``generate`` over the held-out prompts (zoo/eval_prompts.json), b at a time (batch 32:
the 24 prompts and 8 of them again), after untimed warm-up rounds (every prompt's prefill, and b
prompts of decoding at the row's batch and temperature). Two rates: steady, over the engine steps in
which all b requests decode (what a server sustains at that batch size: the figure the speed-ups
compare), and closed-batch, the whole run, prefill included, and the tail where a batch's requests
finish at different steps (with speculation they do, without it they all finish together). During a
row the heap is frozen (``gc.freeze``, as ``outpace serve`` freezes it), so no full collection pauses
a timed step. The widened checkpoints are written once into ``workdir`` and reused by later runs.

``family`` (issue 43 item 6): the zoo's other targets, widened into real shapes with their EAGLE3 drafts
(bench/widen_deepseek.py: DeepSeek-V2-Lite-like; widen_hybrid.py: Qwen3.5; widen_gemma.py: Gemma-3-12B),
timed with MTP (the targets that carry MTP layers), EAGLE3 chains and trees against plain decoding: the
same rows, table and JSON (``e2e_bench_<family>.json``), acceptance measured, not assumed. ``tiny``:
each family's small test widening, float32 on the CPU when there is no GPU, batches 1 and 2 and a few
prompts: the whole path end to end in seconds (a test, not a benchmark).
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from outpace import LLM, SamplingParams
from outpace.bench.widen import LLAMA_8B, Shape, widen_zoo
from outpace.bench.widen_deepseek import DS_TINY, DS_TINY_DRAFT, widen_deepseek_zoo
from outpace.bench.widen_gemma import GEMMA_TINY, GEMMA_TINY_DRAFT, widen_gemma_zoo
from outpace.bench.widen_hybrid import QWEN35_TINY, QWEN35_TINY_DRAFT, widen_hybrid_zoo
from outpace.config import SpeculativeConfig
from outpace.engine.cuda_graphs import bucket_for
from outpace.engine.step_key import SamplingMode, StepKey
from outpace.speculative.metrics import SpecMetrics
from outpace.speculative.proposer import DraftShape
from outpace.zoo import zoo_dir

BATCHES, TEMPERATURES = (1, 8, 32), (0.0, 0.8)
ZOO_MODELS = (
    "tinypy",
    "tinypy-eagle3",
    "tinypy-dflash",
    "tinypy-draft",
)  # the target and its drafts


# A small widening of tinypy for ``tiny`` runs (every map exercised; its standalone draft's shape too).
LLAMA_TINY = Shape(hidden=384, layers=8, heads=12, kv_heads=4, head_dim=64, intermediate=768)
LLAMA_TINY_DRAFT = Shape(hidden=256, layers=3, heads=8, kv_heads=2, head_dim=64, intermediate=512)


@dataclass(frozen=True)
class Family:
    """A zoo target, its drafts, how they are widened (real shapes, and the tiny test ones) and the
    steps its MTP layers draft at most (0: no MTP drafter; past the target's layers the last one goes on,
    speculative/drafters/mtp.py), adaptive speculation choosing how many."""

    models: tuple[str, ...]  # the target first
    shape: str
    mtp_steps: int
    widen: Callable[[Path, Path, bool, torch.dtype], dict[str, Path]]  # (zoo, out, tiny, dtype)


def _tiny_or(real: tuple, tiny: tuple, is_tiny: bool) -> tuple:
    return tiny if is_tiny else real


FAMILIES = {
    "llama": Family(
        ZOO_MODELS,
        "Llama-3.1-8B (widened zoo)",
        5,  # 3 layers
        lambda zoo, out, tiny, dtype: widen_zoo(
            zoo, out, *_tiny_or((LLAMA_8B, None), (LLAMA_TINY, LLAMA_TINY_DRAFT), tiny), dtype
        ),
    ),
    "deepseek": Family(
        ("tinyds", "tinyds-eagle3"),
        "DeepSeek-V2-Lite-like (widened tinyds: 6 of 64 experts active as copies of the zoo's 2 of 8)",
        4,  # 2 layers
        lambda zoo, out, tiny, dtype: widen_deepseek_zoo(
            zoo, out, *_tiny_or((), (DS_TINY, DS_TINY_DRAFT), tiny), dtype=dtype
        ),
    ),
    "qwen35": Family(
        ("tinyqwen35", "tinyqwen35-eagle3"),
        "Qwen3.5 (widened tinyqwen35: gated DeltaNet + gated attention)",
        4,  # 2 layers
        lambda zoo, out, tiny, dtype: widen_hybrid_zoo(
            zoo, out, *_tiny_or((), (QWEN35_TINY, QWEN35_TINY_DRAFT), tiny), dtype=dtype
        ),
    ),
    "gemma": Family(
        ("tinygemma", "tinygemma-eagle3"),
        "Gemma-3-12B (widened tinygemma)",
        0,
        lambda zoo, out, tiny, dtype: widen_gemma_zoo(
            zoo, out, *_tiny_or((), (GEMMA_TINY, GEMMA_TINY_DRAFT), tiny), dtype=dtype
        ),
    ),
}


def widened_zoo(
    workdir: Path, family: str = "llama", tiny: bool = False, dtype: torch.dtype = torch.bfloat16
) -> dict[str, Path]:
    """The family's zoo target and drafts widened under ``workdir`` (llama: the 8B shape, at the top of
    it; the others in ``workdir/<family>``; ``tiny``: ``workdir/tiny/<family>``), written once, then reused."""
    fam = FAMILIES[family]
    root = workdir / "tiny" / family if tiny else workdir if family == "llama" else workdir / family
    models = {name: root / name for name in fam.models}
    if not all((d / "config.json").is_file() for d in models.values()):
        fam.widen(zoo_dir(), root, tiny, dtype)
    return models


def drafters(models: dict[str, Path], family: str = "llama") -> dict[str, SpeculativeConfig]:
    """The methods timed: each drafter as a user would configure it (adaptive shapes up to these)."""
    if family != "llama":  # the families' zoo drafts: EAGLE3 trained over 4 TTT steps, MTP layers
        eagle3, steps = str(models[FAMILIES[family].models[1]]), FAMILIES[family].mtp_steps
        specs = {
            "none": SpeculativeConfig(),
            "eagle3": SpeculativeConfig("eagle3", eagle3, num_steps=4, adaptive=True),
            "eagle3-tree": SpeculativeConfig(
                "eagle3", eagle3, num_steps=4, topk=4, num_draft_tokens=16, adaptive=True
            ),
        }
        if steps:
            specs["mtp"] = SpeculativeConfig("mtp", num_steps=steps, adaptive=True)
        return specs
    return {
        "none": SpeculativeConfig(),
        "eagle3": SpeculativeConfig(
            "eagle3", str(models["tinypy-eagle3"]), num_steps=5, adaptive=True
        ),
        "eagle3-tree": SpeculativeConfig(
            "eagle3",
            str(models["tinypy-eagle3"]),
            num_steps=5,
            topk=4,
            num_draft_tokens=16,
            adaptive=True,
        ),
        "mtp": SpeculativeConfig("mtp", num_steps=FAMILIES["llama"].mtp_steps, adaptive=True),
        "dflash": SpeculativeConfig(
            "dflash", str(models["tinypy-dflash"]), num_steps=7, adaptive=True
        ),
        "draft": SpeculativeConfig(
            "draft", str(models["tinypy-draft"]), num_steps=4, adaptive=True
        ),
        "ngram": SpeculativeConfig("ngram", num_steps=4, adaptive=True),
    }


def _groups(prompts: list[str], batch: int, count: int) -> list[list[str]]:
    """``count`` prompts (cycling through them) in groups of ``batch``."""
    cycled = [prompts[i % len(prompts)] for i in range(count)]
    return [cycled[i : i + batch] for i in range(0, count, batch)]


def _run(llm: LLM, prompts: list[str], batch: int, params: SamplingParams, count: int):
    """(outputs, seconds, steady tokens/s) of generating ``count`` prompts ``batch`` at a time. Steady:
    tokens per second over the engine steps in which all ``batch`` requests of a group were decoding
    (no prefill, none finished yet): a server's rate at that batch size, without the tail of a closed
    batch whose requests finish at different steps (with speculation they do)."""
    engine, steady = llm.engine, [0.0, 0]
    real_step = engine.step

    def step():
        running = engine.scheduler.running
        full = (
            not engine.scheduler.waiting
            and len(running) == batch
            and all(r.num_tokens - r.num_computed_tokens == 1 for r in running)
        )
        before = sum(r.num_output_tokens for r in running)
        t = time.perf_counter()
        outputs = real_step()
        if full and len(engine.scheduler.running) == batch:  # and none finished in it
            steady[0] += time.perf_counter() - t
            steady[1] += sum(r.num_output_tokens for r in engine.scheduler.running) - before
        return outputs

    engine.step = step
    gc.collect()
    gc.freeze()  # as a server does (server/app.py): no full collection scans the engine inside a timed step
    try:
        _sync()
        t0 = time.perf_counter()
        outs = [o for group in _groups(prompts, batch, count) for o in llm.generate(group, params)]
        _sync()
    finally:
        engine.step = real_step
        gc.unfreeze()
    return outs, time.perf_counter() - t0, steady[1] / steady[0] if steady[0] else float("nan")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _match(outs, reference) -> float:
    """The fraction of tokens equal to the reference's, position by position."""
    same = total = 0
    for o, ref in zip(outs, reference):
        total += len(ref)
        same += sum(a == b for a, b in zip(o.token_ids, ref))
    return same / total


def bench_device() -> tuple[str, str]:
    """(device, dtype) the rows run in: bf16 on the GPU, float32 on a CPU."""
    return ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")


def target_llm(
    models: dict[str, Path], family: str, spec: SpeculativeConfig, tiny: bool, **engine
) -> LLM:
    """The family's widened target with ``spec``'s drafter, as a row times it."""
    return LLM(
        str(models[FAMILIES[family].models[0]]),
        num_kv_blocks=256 if tiny else 1024,
        speculative=spec,
        **engine,
    )


def row_params(temperature: float, max_tokens: int) -> SamplingParams:
    """A row's sampling: ``max_tokens`` each, sampled rows seeded."""
    return SamplingParams(
        temperature=temperature,
        max_tokens=max_tokens,
        ignore_eos=True,
        seed=0 if temperature else None,
    )


def run_e2e_bench(
    out_dir: Path,
    workdir: Path,
    methods: list[str] | None = None,
    max_tokens: int = 128,
    batch1_prompts: int = 8,
    family: str = "llama",
    tiny: bool = False,
    batches: list[int] | None = None,
) -> dict:
    """Run the methods (default: all) at ``batches`` (default: 1, 8, 32; tiny: 1, 2); rows of earlier runs
    in ``out_dir/e2e_bench[_<family>].json`` are kept, so the methods may be split over several runs.
    ``family``, ``tiny``: module docstring. A batch b times ``b`` prompts but at 1 and 8 (module
    docstring's prompt counts)."""
    if batches is not None and (not batches or min(batches) < 1):
        raise ValueError(f"bench e2e --batch-sizes {batches}: each batch must be >= 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "e2e_bench" if family == "llama" else f"e2e_bench_{family}"
    path = out_dir / f"{stem}.json"
    result = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    device, dtype = bench_device()
    models = widened_zoo(workdir, family, tiny, getattr(torch, dtype))
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    batches = tuple(batches) if batches else (1, 2) if tiny else BATCHES
    counts = {1: 1, 2: 2} if tiny else {1: batch1_prompts, 8: len(prompts)}
    counts = {b: counts.get(b, b) for b in batches}  # prompts timed per batch
    specs = drafters(models, family)
    unknown = set(methods or ()) - set(specs)
    if unknown:
        raise ValueError(
            f"bench e2e --family {family}: no method {sorted(unknown)}; of {list(specs)}"
        )
    result.update(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        torch=torch.__version__,
        family=family,
        shape=FAMILIES[family].shape + (" (tiny test widening)" if tiny else ""),
        max_tokens=max_tokens,
        prompts=counts,
    )
    engine = dict(device=device, dtype=dtype, max_num_seqs=max(batches))
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    zoo = LLM(str(zoo_dir() / FAMILIES[family].models[0]), **engine)
    result["zoo_greedy"] = {
        str(b): [o.token_ids for o in _run(zoo, prompts, b, greedy, counts[b])[0]] for b in batches
    }
    del zoo
    rows = [r for r in result["rows"] if r["method"] not in (methods or specs)]
    plain_greedy = result.setdefault(
        "plain_greedy", {}
    )  # batch -> the widened target's own greedy tokens
    for name in tqdm(methods or list(specs), desc="e2e methods"):
        llm = target_llm(models, family, specs[name], tiny, **engine)
        # each sampling mode's step costs as start-up profiled them over idle rows (engine/runner.py ``profile``)
        profiled = {mode: dict(c.costs) for mode, c in llm.engine.choosers.items()}
        for b in batches:
            _run(
                llm, prompts, b, greedy.replace(max_tokens=4), counts[b]
            )  # warm-up: every prefill shape of the row
            for t in TEMPERATURES:
                params = row_params(t, max_tokens)
                _run(
                    llm, prompts, b, params, b
                )  # warm-up: decode steps of this batch and temperature
                outs, seconds, steady = _run(llm, prompts, b, params, counts[b])
                row = {
                    "method": name,
                    "batch": b,
                    "temperature": t,
                    "steady_tokens_per_s": steady,
                    "tokens_per_s": sum(len(o.token_ids) for o in outs) / seconds,
                    "seconds": seconds,
                }
                spec = SpecMetrics.total(o.spec_metrics for o in outs)
                if spec.num_verifies:
                    row["tau"] = spec.acceptance_length
                    row["verifies_by_num_drafts"] = spec.verifies_by_num_drafts
                mode = SamplingMode.of([params])
                chooser = llm.engine.choosers.get(mode)
                if chooser is not None:  # what adaptive speculation knew after the row
                    shapes, bucket = (
                        llm.engine.runner.shapes,
                        bucket_for(llm.engine.runner.graph_buckets, b),
                    )
                    row["chooser"] = {
                        "acceptance": {
                            s.label: chooser.acceptance(s) for s in shapes if s.num_steps
                        },
                        "step_ms": {
                            s.label: 1e3 * c for (bk, s), c in chooser.costs.items() if bk == bucket
                        },
                        "profiled_step_ms": {
                            s.label: 1e3 * c
                            for (bk, s), c in profiled[mode].items()
                            if bk == bucket
                        },
                    }
                    row["wall_ms_per_step"] = 1e3 * seconds / max(1, spec.num_verifies / counts[b])
                elif (
                    name == "none"
                ):  # plain decoding's step, profiled as the drafters' (their "none": held)
                    bucket = bucket_for(llm.engine.runner.graph_buckets, b) or b  # (none: eager)
                    key = StepKey(bucket, DraftShape(0), mode)
                    row["profiled_step_ms"] = 1e3 * llm.engine.runner.profile(key)
                if t == 0:
                    tokens = [o.token_ids for o in outs]
                    row["match_zoo_greedy"] = _match(outs, result["zoo_greedy"][str(b)])
                    if name == "none":
                        plain_greedy[str(b)] = tokens
                    if str(b) in plain_greedy:
                        row["match_plain_greedy"] = _match(outs, plain_greedy[str(b)])
                rows.append(row)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        result["rows"] = rows
        path.write_text(json.dumps(_with_speedups(result), indent=2) + "\n")
    result = _with_speedups(result)
    path.write_text(json.dumps(result, indent=2) + "\n")
    plot_e2e(result, out_dir, stem)
    print_e2e(result)
    return result


def _with_speedups(result: dict) -> dict:
    """``speedup``: steady tokens/s over plain decoding's at the same batch and temperature;
    ``speedup_closed_batch``: the same for the whole run (prefill and the batch's tail included)."""
    rows = {(r["batch"], r["temperature"]): r for r in result["rows"] if r["method"] == "none"}
    for r in result["rows"]:
        base = rows.get((r["batch"], r["temperature"]))
        if base is not None:
            r["speedup"] = r["steady_tokens_per_s"] / base["steady_tokens_per_s"]
            r["speedup_closed_batch"] = r["tokens_per_s"] / base["tokens_per_s"]
    return result


def print_e2e(result: dict) -> None:
    if result.get("family", "llama") != "llama":  # what was widened, and how its routing was kept
        print(f"\n{result['shape']}, {result['device']}")
    print(
        f"\n{'method':<12} {'batch':>5} {'temp':>4} {'tokens/s':>9} {'vs plain':>8} {'closed':>7} {'tau':>5} "
        f"{'match':>6}"
    )
    for r in result["rows"]:
        print(
            f"{r['method']:<12} {r['batch']:>5} {r['temperature']:>4} {r['steady_tokens_per_s']:>9.1f} "
            f"{r.get('speedup', float('nan')):>7.2f}x {r.get('speedup_closed_batch', float('nan')):>6.2f}x "
            f"{r.get('tau', 1.0):>5.2f} {r.get('match_plain_greedy', float('nan')):>6.1%}"
        )


def plot_e2e(result: dict, out_dir: Path, stem: str = "e2e_bench") -> None:
    """Speed-up over plain decoding per method, one panel per temperature, bars by batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in dict.fromkeys(r["method"] for r in result["rows"]) if m != "none"]
    batches = sorted({r["batch"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(TEMPERATURES), figsize=(12, 4), sharey=True)
    for ax, t in zip(axes, TEMPERATURES):
        for i, b in enumerate(batches):
            values = [
                next(
                    (
                        r.get("speedup", 0)
                        for r in result["rows"]
                        if r["method"] == m and r["batch"] == b and r["temperature"] == t
                    ),
                    0,
                )
                for m in methods
            ]
            ax.bar(
                [j + 0.27 * (i - 1) for j in range(len(methods))],
                values,
                width=0.27,
                label=f"batch {b}",
            )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(methods)), methods, rotation=30)
        ax.set_title(f"temperature {t}")
    axes[0].set_ylabel("tokens/s over plain decoding")
    axes[0].legend()
    fig.suptitle(f"outpace bench e2e: {result.get('shape')}, {result.get('device')}")
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}.png", dpi=110)
    plt.close(fig)
