"""``outpace bench gpu --parts s`` and ``python -m outpace.bench.families --out DIR``: every seed family at
its public shape (bench/family_shapes.py) with random bf16 weights built on the GPU (``load_format="dummy"``,
no download), through the real engine path (``LLM``, the decode step captured as CUDA graphs).

Per shape:
- decode: engine steps at batch 1, 8, 32 with every request running at context 512 (bench/gpu.py
  ``time_decode``): tokens/s and the fraction of the floor; a batch that does not fit is skipped, saying
  why;
- the floor: the bytes a decode step must read over the device copy bandwidth measured in the same run
  (bytes read plus written, bench/gpu.py ``copy_bandwidth``). Bytes: every weight the step uses (the
  input embedding tables one row per token; of the routed experts only the distinct experts the batch
  chose: the EXPECTED count for uniform random routing, E (1 - (1 - k/E)^n) for n tokens choosing k of E
  each, not counted from the routing), the KV or latent cache rows read (a sliding layer's window at most)
  and each request's recurrent state, read and written;
- verify cost: the captured speculative step (n-gram drafts, adaptive so that every draft count is
  captured) verifying t = 1 .. 8 tokens per sequence at batch 1 and 8, GPU time of a replay (median of
  20) relative to t = 1. Replays run on the padding row, so attention reads no context: the cost of the
  weights, the t-token forward and the step's accept and state bookkeeping;
- kernels: torch.profiler over 3 replays of the captured greedy decode step at batch 1 (padding rows), its
  GPU kernels and copies per replay (the step's sampling included).
A layer slice (family_shapes.FamilyShape.is_slice) is reported per layer too: step time and floor bytes
over its decoder layers (the embedding and head are counted in them).
``--quantized fp8``: each shape's config with DeepSeek-V3's block-FP8 ``quantization_config``
(``QUANTIZATION_CONFIGS``), so the dummy load builds its projections quantized with random fp8 values and
scales (models/loader.py); the floor counts every parameter at its stored size (fp8 weights, their scales).
``--quantized fp8-published``: the same, but projections a family's FP8 checkpoint keeps unquantized stay bf16
(``PUBLISHED_FP8_UNQUANTIZED``: Qwen3-Next's and Qwen3.5's linear-attention b and a), for the shapes whose
published layout differs (``QUANTIZED_SHAPES``).
``--quantized int4``: Kimi-K2-Thinking's compressed-tensors W4A16 config (INT4 routed experts, packed words
of random nibbles with bf16 group scales; attention, shared experts, dense MLPs and head bf16), for the
DeepSeek-V3-architecture shapes its ignore list is written for (``QUANTIZED_SHAPES``).
``--quantized w4a16``: the same format on every decoder projection, the head bf16, in groups of 128 (RedHatAI's w4a16
releases, Gemma 4 QAT's layout), for Llama-3.1-8B and Gemma-3-12B.
``qwen3-next-80b`` is the whole model: it runs quantized only (``NEEDS_QUANTIZATION``), and in place of the
n-gram verify sweep its own MTP layer (a third engine) gives the captured step's cost with 0..3 drafts and
the speed-up they give under ORACLE acceptance (assumed, not measured: random weights accept nothing),
labelled so (``MTP_ORACLE_SHAPES``, ``mtp_oracle``).
``--compare-with DIR``: each shape's decode rows beside those of other runs (the bf16 run's families.json,
another quantization's), with this run's speed-up over each.

This file and family_shapes.py use only APIs of outpace as of commit 83e3598 (the quantized runs and the
MTP rows apart), so that both run unchanged in a checkout of it (a measurement before and after a change,
in one device command).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from outpace import LLM
from outpace.attention.layer import PagedCacheLayer
from outpace.bench.family_shapes import FamilyShape, experts_per_token, family_shapes
from outpace.config import SpeculativeConfig
from outpace.engine.cuda_graphs import bucket_for
from outpace.engine.step_key import SamplingMode, StepKey
from outpace.layers.embedding import LMHead
from outpace.layers.moe import RoutedExperts
from outpace.speculative.proposer import DraftShape

BATCHES, CONTEXT = (1, 8, 32), 512
VERIFY_BATCHES, MAX_VERIFY_TOKENS = (1, 8), 8
# Rough seconds per shape on an H200 (two engines built with their graphs, the timings), for the time limit;
# the first shape of a process also compiles the Triton kernels.
ESTIMATE_S = {
    "llama-3.1-8b": 110,
    "deepseek-v2-lite": 150,
    "deepseek-v3-slice": 150,
    "kimi-k2-slice": 150,
    "qwen3-next-80b-slice": 140,
    # quantized only: two engines of the whole model (about 74,000 quantized projections each) and the MTP
    # engine's 48 captured steps
    "qwen3-next-80b": 180,
    "qwen3.5": 110,
    # whole models, not yet run on a GPU (the estimates: the Qwen3-Next slice's and the whole model's)
    "qwen3-30b-a3b": 150,
    "qwen3.5-35b-a3b": 180,
    "nemotron-h-8b": 110,
    "gemma-3-12b": 110,
    "gemma-4-26b-a4b": 140,
    "mistral-small-4-slice": 130,
    "step-3.5-flash-slice": 130,
}


# ---- the floor ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepBudget:
    """What a forward reads, by part (bytes)."""

    always: int  # weights every forward reads whole (all but the routed experts and untied input tables)
    embedding_row: int  # one token's rows of the input tables a head does not share
    expert: int  # one routed expert
    moe_layers: int
    num_experts: int
    top_k: int
    # per cached layer: (one token's row, its sliding window or None)
    kv_rows: tuple[tuple[int, int | None], ...]
    state: int  # one request's recurrent state
    # the ranks the routed experts are placed over (expert parallelism): each holds 1 / expert_ranks of them,
    # so of the distinct experts a batch chooses it reads its share
    expert_ranks: int = 1


def distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """The expected number of distinct experts ``tokens`` tokens choose when each chooses ``top_k`` distinct
    experts of ``num_experts`` uniformly at random: each expert is missed by a token with probability
    1 - k/E, independently across tokens."""
    if not num_experts:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def step_bytes(budget: StepBudget, batch: int, context: int, tokens: int = 1) -> float:
    """Bytes a forward of ``batch`` sequences bringing ``tokens`` tokens each after ``context`` cached ones
    must read: the weights (module docstring), every cached layer's rows (up to its window) of each
    sequence, and each sequence's recurrent state read and written."""
    n = batch * tokens
    kv = sum(row * min(context + tokens, window or math.inf) for row, window in budget.kv_rows)
    experts = (
        budget.moe_layers
        * distinct_experts(budget.num_experts, budget.top_k, n)
        / budget.expert_ranks
    )
    return (
        budget.always
        + n * budget.embedding_row
        + experts * budget.expert
        + batch * kv
        + 2 * batch * budget.state
    )


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def step_budget(llm: LLM, config: dict) -> StepBudget:
    """The budget of the engine's target: its parameters by part, the rows of its bound caches and the
    per-request rows of its recurrent states. The experts of a ``RoutedExperts`` are its parameters but
    those of a router inside it (``gate.*``, Step-3.5's layout); under expert parallelism it holds this
    rank's experts only (``num_experts`` of them)."""
    model, runner = llm.engine.model, llm.engine.runner
    params = {id(p): p for p in model.parameters()}
    moes = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    routed = [p for m in moes for name, p in m.named_parameters() if name.split(".")[0] != "gate"]
    heads = {id(m.weight) for m in model.modules() if isinstance(m, LMHead)}
    tables = [
        m.weight
        for m in model.modules()
        if isinstance(m, nn.Embedding) and id(m.weight) not in heads
    ]
    skipped = {id(p) for p in routed + tables}
    num_experts, top_k = experts_per_token(config)
    caches = [m for m in model.model.modules() if isinstance(m, PagedCacheLayer)]
    return StepBudget(
        always=_bytes(p for i, p in params.items() if i not in skipped),
        embedding_row=_bytes(t[0] for t in tables),
        expert=_bytes(routed) // max(1, sum(m.num_experts for m in moes)),
        moe_layers=len(moes),
        num_experts=num_experts,
        top_k=top_k,
        kv_rows=tuple(
            (_bytes(t[0, 0] for t in m.kv_cache), getattr(m, "sliding_window", None))
            for m in caches
        ),
        state=_bytes(t[0] for t in runner.states.tensors()),
        expert_ranks=num_experts // moes[0].num_experts if moes else 1,
    )


# ---- the engines ----------------------------------------------------------------------------------------
def build(
    workdir: Path,
    config: dict,
    max_num_seqs: int,
    graph_sizes: tuple[int, ...],
    speculative: SpeculativeConfig | None = None,
    **engine_kwargs,
) -> LLM:
    """The shape with random bf16 weights on the GPU, its decode step captured for ``graph_sizes``, KV blocks
    for ``max_num_seqs`` requests of CONTEXT tokens and the decode steps timed after it (bench/gpu.py
    ``time_decode``: 27 steps); ``engine_kwargs``: other EngineConfig settings (a benchmark's variable)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(config))
    return LLM(
        str(workdir),
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        block_size=16,
        num_kv_blocks=max_num_seqs * (-(-(CONTEXT + 128) // 16)) + 64,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        cuda_graph_sizes=graph_sizes,
        speculative=speculative or SpeculativeConfig(),
        **engine_kwargs,
    )


def close(llm: LLM) -> None:
    """Free the engine's GPU memory before the next one is built (the caller's ``llm`` is left without its
    engine, so its model, caches and graphs go with it)."""
    llm.close()
    del llm.engine
    gc.collect()
    torch.cuda.empty_cache()


def decode_rows(llm: LLM, budget: StepBudget, bandwidth: float, layers: int) -> list[dict]:
    """bench/gpu.py ``time_decode`` at each batch against the floor; per layer too (see module docstring)."""
    from outpace.bench.gpu import time_decode

    rows, failed = [], None
    for batch in BATCHES:
        if failed is not None:  # a larger batch needs more still
            rows.append({"batch": batch, "skipped": f"a smaller batch did not fit: {failed}"})
            continue
        try:
            row = time_decode(llm, batch, CONTEXT)
        except RuntimeError as e:  # out of memory, or the pool held too few of its requests
            failed = f"{type(e).__name__}: {e}"[:300]
            rows.append({"batch": batch, "skipped": failed})
            continue
        floor_bytes = step_bytes(budget, batch, CONTEXT)
        floor_steps = bandwidth / floor_bytes
        row.update(
            floor_bytes=floor_bytes,
            floor_tokens_per_s=floor_steps * batch,
            fraction_of_floor=(1e3 / row["step_ms"]) / floor_steps,
            expected_distinct_experts=distinct_experts(budget.num_experts, budget.top_k, batch),
            step_ms_per_layer=row["step_ms"] / layers,
            floor_bytes_per_layer=floor_bytes / layers,
        )
        rows.append(row)
    return rows


def verify_costs(llm: LLM, repeats: int = 20) -> list[dict]:
    """Per batch: GPU ms of the captured greedy step verifying t = 1 .. 8 tokens per sequence (t - 1 n-gram
    drafts), and each relative to t = 1 (lists indexed by t - 1)."""
    runner = llm.engine.runner
    rows = []
    for batch in VERIFY_BATCHES:
        bucket = bucket_for(runner.graph_buckets, batch)
        ms = [
            1e3 * runner.profile(StepKey(bucket, DraftShape(t - 1), SamplingMode.GREEDY), repeats)
            for t in range(1, MAX_VERIFY_TOKENS + 1)
        ]
        rows.append({"batch": batch, "ms": ms, "relative": [v / ms[0] for v in ms]})
    return rows


def mtp_oracle(llm: LLM, batches: tuple[int, ...], context: int) -> list[dict]:
    """Per batch: the captured step's seconds with 0..k drafts of the target's MTP layer (adaptive
    speculation's start-up profile of each captured step on a GPU; on the CPU, measured by running a step of
    each at ``context``) and, at each assumed acceptance, the best k, its speed-up over plain decoding (the
    step with 0 drafts) and the tokens/s it gives (bench/oracle.py ``oracle_rows``), labelled ORACLE."""
    from outpace.bench.oracle import ORACLE_LABEL, captured_step_costs, oracle_rows

    rows = []
    for batch in batches:
        seconds = captured_step_costs(llm, batch, context)
        rows.append(
            {
                "batch": batch,
                "label": ORACLE_LABEL,
                "step_ms": {k: 1e3 * c for k, c in sorted(seconds.items())},
                "speedups": oracle_rows(seconds, batch),
            }
        )
    return rows


def run_mtp_oracle(config: dict, workdir: Path, token_map: str | None = None) -> dict:
    """``mtp_oracle`` at every batch of an engine of ``config`` with its MTP layer (family_shapes.py
    ``with_mtp``) drafting up to bench/hybrid_shape.py's MTP_STEPS tokens, adaptively (so that every draft
    count is captured and profiled); through ``token_map`` when given (speculative/hot_vocab.py)."""
    from outpace.bench.family_shapes import with_mtp
    from outpace.bench.hybrid_shape import MTP_STEPS

    t0 = time.perf_counter()
    spec = SpeculativeConfig("mtp", num_steps=MTP_STEPS, adaptive=True, token_map=token_map)
    llm = build(workdir, with_mtp(config), max(BATCHES), BATCHES, spec)
    try:
        build_s = time.perf_counter() - t0
        return {"build_s": build_s, "rows": mtp_oracle(llm, BATCHES, CONTEXT)}
    finally:
        close(llm)


def profile_decode_replays(llm: LLM, batch: int = 1, replays: int = 3):
    """torch.profiler over ``replays`` replays of the captured greedy decode step of ``batch`` (rows of the
    padding index), after one replay unprofiled."""
    from torch.profiler import ProfilerActivity, profile

    from outpace.bench.profile import _decode_key

    runner = llm.engine.runner
    graph = runner.decode_step.graphs[_decode_key(llm.engine, batch)]
    runner.decode_step.batch_indices.fill_(runner.req_table.padding_index)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    return prof


def kernel_count(llm: LLM, batch: int = 1, replays: int = 3) -> dict:
    """Kernels and copies of one replay of the captured greedy decode step (rows of the padding index)."""
    from outpace.bench.profile import _cuda_events

    events = _cuda_events(profile_decode_replays(llm, batch, replays))
    copies = sum(e.name.startswith(("Memcpy", "Memset")) for e in events)
    return {
        "batch": batch,
        "what": "torch.profiler over graph replays of the captured greedy decode step, per replay",
        "kernels": (len(events) - copies) / replays,
        "copies": copies / replays,
    }


def run_shape(shape: FamilyShape, workdir: Path, bandwidth: float, verify: bool = True) -> dict:
    """Every measurement of the module docstring for one shape (``verify``: the n-gram verify sweep; a shape
    of ``MTP_ORACLE_SHAPES`` has its MTP layer's oracle rows in its place)."""
    layers = shape.config["num_hidden_layers"]
    result = {
        "copy_bandwidth_bytes_per_s": bandwidth,  # (a rerun into the same --out measures it again)
        "source": shape.source,
        "layers": layers,
        "full_layers": shape.full_layers,
        "slice": shape.is_slice,
        "note": shape.note,
        "config": shape.config,
    }
    t0 = time.perf_counter()
    llm = build(workdir, shape.config, max(BATCHES), BATCHES)
    try:
        result["build_s"] = time.perf_counter() - t0
        budget = step_budget(llm, shape.config)
        result["bytes"] = asdict(budget)
        result["parameters"] = sum(p.numel() for p in llm.engine.model.parameters())
        result["decode"] = decode_rows(llm, budget, bandwidth, layers)
        result["kernels"] = kernel_count(llm)
    finally:
        close(llm)
    mtp = shape.name in MTP_ORACLE_SHAPES
    result["verify"] = []
    try:  # (the decode figures stand without either)
        if mtp:
            result["mtp_oracle"] = run_mtp_oracle(shape.config, workdir / "mtp")
        elif verify:
            spec = SpeculativeConfig("ngram", num_steps=MAX_VERIFY_TOKENS - 1, adaptive=True)
            llm = build(workdir, shape.config, max(VERIFY_BATCHES), VERIFY_BATCHES, spec)
            try:
                result["verify"] = verify_costs(llm)
            finally:
                close(llm)
    except Exception as e:
        result["mtp_error" if mtp else "verify_error"] = f"{type(e).__name__}: {e}"
    result["seconds"] = time.perf_counter() - t0
    return result


# ---- the run --------------------------------------------------------------------------------------------
# --quantized: the quantization_config added to each shape's config (DeepSeek-V3's config.json, as published
# in deepseek-ai/DeepSeek-V3: block FP8 e4m3, 128 x 128 blocks, activations quantized at run time)
QUANTIZATION_CONFIGS = {
    "fp8": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
    # huggingface.co/moonshotai/Kimi-K2-Thinking's config.json: compressed-tensors pack-quantized W4A16, 4-bit
    # symmetric integers in groups of 32 (layers/quant/scheme.py parses it); its ignore list keeps attention,
    # the shared experts, the dense MLPs and the head bf16, so the routed experts alone are INT4
    "int4": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 32,
                    "dynamic": False,
                    "actorder": None,
                    "block_structure": None,
                    "observer": "minmax",
                    "observer_kwargs": {},
                },
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": [
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
        ],
    },
}
# --quantized w4a16: compressed-tensors pack-quantized INT4 on every decoder projection, the head kept: the layout of
# huggingface.co/RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 ("Only the weights of the linear operators
# within transformers blocks are quantized", symmetric groups of 128) and of Gemma 4 QAT's w4a16 releases (every
# language-model projection: tests/models/test_quantized_checkpoints.py), which the fused stack reads through the
# quantized product (layers/quant/int4_weight.py)
QUANTIZATION_CONFIGS["w4a16"] = {
    **QUANTIZATION_CONFIGS["int4"],
    "config_groups": {
        "group_0": {
            **QUANTIZATION_CONFIGS["int4"]["config_groups"]["group_0"],
            "weights": {
                **QUANTIZATION_CONFIGS["int4"]["config_groups"]["group_0"]["weights"],
                "group_size": 128,
            },
        }
    },
    "ignore": ["lm_head"],
}
# --quantized fp8-published: block FP8 as a family's own FP8 checkpoint lays it out where that keeps projections
# unquantized beside the fp8 ones (``modules_to_not_convert``, by model_type): Qwen3-Next-80B-A3B-Instruct-FP8 its
# in_proj_ba, the Qwen3.5 FP8 releases their in_proj_b and in_proj_a (tests/models/test_quantized_checkpoints.py
# writes those layouts); --quantized fp8 quantizes every projection of every shape.
QUANTIZATION_CONFIGS["fp8-published"] = QUANTIZATION_CONFIGS["fp8"]
PUBLISHED_FP8_UNQUANTIZED = {
    "qwen3_next": ["in_proj_ba"],
    "qwen3_5_text": ["in_proj_b", "in_proj_a"],
    "qwen3_5_moe_text": ["in_proj_b", "in_proj_a"],
}
# The shapes each quantization applies to (None: every shape). Kimi's ignore list names DeepSeek-V3's modules
# (self_attn, shared_experts, a dense layer's mlp.*_proj): on another family it would quantize attention.
# The shapes a quantization applies to; None: every shape but those whose experts are fused stacks (gate_up_proj
# [E, 2I, H]), which the dummy load does not quantize (layers/quant/loading.py quantize_dummy_modules)
FUSED_EXPERT_SHAPES = ("gemma-4-26b-a4b", "mistral-small-4-slice")
QUANTIZED_SHAPES = {
    "fp8": None,
    "fp8-published": ("qwen3-next-80b-slice", "qwen3-next-80b", "qwen3.5", "qwen3.5-35b-a3b"),
    "int4": ("deepseek-v3-slice", "kimi-k2-slice"),
    "w4a16": ("llama-3.1-8b", "gemma-3-12b"),
}
# The shapes that run quantized only, and why.
NEEDS_QUANTIZATION = {
    "qwen3-next-80b": "its 80B parameters are 160 GB in bf16, more than one H200's 141 GB: run it with "
    "--quantized fp8 (80 GB)"
}
# The shapes whose own MTP layer is measured under ORACLE acceptance, in place of the n-gram verify sweep.
MTP_ORACLE_SHAPES = ("qwen3-next-80b",)


def bench_shapes(quantized: str | None, names: list[str] | None = None) -> dict[str, FamilyShape]:
    """The shapes a run measures, in order: ``names``, or every shape the run's quantization applies to
    (``QUANTIZED_SHAPES``; unquantized, all but ``NEEDS_QUANTIZATION``), each config with the quantization's
    ``quantization_config``. A name that is no shape, that the quantization does not apply to or that
    cannot run unquantized is refused: ValueError naming it and why."""
    shapes = family_shapes()
    unknown = sorted(set(names or ()) - set(shapes))
    if unknown:
        raise ValueError(f"unknown shapes {unknown}: must be of {', '.join(shapes)}")
    if quantized is None:
        allowed = [n for n in shapes if n not in NEEDS_QUANTIZATION]
    else:
        every = [n for n in shapes if n not in FUSED_EXPERT_SHAPES]
        allowed = list(QUANTIZED_SHAPES[quantized] or every)
    for name in names or ():
        if name in allowed:
            continue
        if quantized is None:
            raise ValueError(f"shape {name!r} without --quantized: {NEEDS_QUANTIZATION[name]}")
        raise ValueError(
            f"shape {name!r} with --quantized {quantized}: the quantization applies to "
            f"{', '.join(allowed)} only (QUANTIZED_SHAPES)"
        )
    return {n: _quantized(shapes[n], quantized) for n in names or allowed}


def _quantized(shape: FamilyShape, quantized: str | None) -> FamilyShape:
    """The shape with ``quantized``'s quantization_config (``QUANTIZATION_CONFIGS``; fp8-published's with the
    family's ``PUBLISHED_FP8_UNQUANTIZED``)."""
    config = QUANTIZATION_CONFIGS.get(quantized)
    if config is None:
        return shape
    kept = PUBLISHED_FP8_UNQUANTIZED.get(shape.config.get("model_type"), [])
    if quantized == "fp8-published" and kept:
        config = {**config, "modules_to_not_convert": ["lm_head", *kept]}
    return replace(shape, config={**shape.config, "quantization_config": config})


def run_families_bench(
    workdir: Path,
    bandwidth: float,
    names: list[str] | None = None,
    time_limit_s: float | None = None,
    done: dict | None = None,
    save=None,
    quantized: str | None = None,
    verify: bool = True,
) -> dict:
    """The shapes ``names`` (``bench_shapes``: all the run's quantization applies to by default) not yet
    measured in ``done`` (name -> result; those with an error or not run are run again) in turn; a shape whose
    estimate (ESTIMATE_S) no longer fits in ``time_limit_s`` is listed as not run. A failing shape records its
    error and the others run. ``save(results)`` after each shape. ``verify``: the n-gram verify sweep."""
    shapes = bench_shapes(quantized, names)
    results = dict(done or {})
    start = time.monotonic()
    for name in tqdm(list(shapes), desc="family shapes"):
        if "decode" in results.get(name, {}):  # measured already
            continue
        left = None if time_limit_s is None else time_limit_s - (time.monotonic() - start)
        if left is not None and ESTIMATE_S[name] > left:
            results[name] = {
                "not_run": f"its estimate {ESTIMATE_S[name]} s > the {left:.0f} s left"
            }
            continue
        try:
            results[name] = run_shape(shapes[name], workdir / name, bandwidth, verify)
        except Exception as e:  # one broken shape must not cost the others' figures
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name} failed: {results[name]['error']}")
        gc.collect()
        torch.cuda.empty_cache()
        if save is not None:
            save(results)
    return results


def plot_families(results: dict, path: Path) -> None:
    """Fraction of the floor per shape and batch (bars); verify cost against tokens per sequence (curves), where
    a verify was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {n: r for n, r in results.items() if "decode" in r}
    verified = any(r.get("verify") for r in measured.values())  # --no-verify: the bars alone
    fig, axes = plt.subplots(1, 2 if verified else 1, figsize=(15 if verified else 7.5, 5.5))
    bars = axes[0] if verified else axes
    width = 0.8 / len(BATCHES)
    for j, batch in enumerate(BATCHES):
        values = [
            next((d.get("fraction_of_floor", 0.0) for d in r["decode"] if d["batch"] == batch), 0.0)
            for r in measured.values()
        ]
        bars.bar(
            [i + j * width for i in range(len(measured))], values, width, label=f"batch {batch}"
        )
    bars.set_xticks(
        [i + width for i in range(len(measured))], list(measured), rotation=35, ha="right"
    )
    bars.set_ylabel(f"fraction of the floor (decode, context {CONTEXT})")
    bars.axhline(1.0, color="grey", lw=0.8)
    bars.legend()
    if verified:
        plot_verify_curves(axes[1], measured)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_verify_curves(curves, measured: dict) -> None:
    """Each shape's captured verify step time against tokens per sequence, relative to 1 token."""
    for i, (name, r) in enumerate(measured.items()):
        for v, style in zip(r.get("verify", []), ("-", "--")):
            tokens = range(1, len(v["relative"]) + 1)
            label = f"{name} b{v['batch']}"
            curves.plot(tokens, v["relative"], style, color=f"C{i}", marker="o", label=label)
    curves.set_xlabel("tokens per sequence verified")
    curves.set_ylabel("captured step time relative to 1 token")
    curves.legend(fontsize=6, ncol=2)


def compare_runs(results: dict, runs: dict[str, dict]) -> dict[str, list[dict]]:
    """Per shape measured here and in other runs (``runs``: label -> that run's shapes): per batch measured in
    both, the other run's tokens/s, fraction of its floor and step ms, and this run's speed-up over it."""
    table: dict[str, list[dict]] = {}
    for name, r in results.items():
        for label, shapes in runs.items():
            theirs = {
                d["batch"]: d for d in shapes.get(name, {}).get("decode", []) if "skipped" not in d
            }
            for d in r.get("decode", []):
                other = theirs.get(d["batch"])
                if "skipped" in d or other is None:
                    continue
                table.setdefault(name, []).append(
                    {
                        "batch": d["batch"],
                        "run": label,
                        "tokens_per_s": other["tokens_per_s"],
                        "fraction_of_floor": other["fraction_of_floor"],
                        "step_ms": other["step_ms"],
                        "speedup": d["tokens_per_s"] / other["tokens_per_s"],
                    }
                )
    return table


def read_runs(folders: list[str]) -> dict[str, dict]:
    """``--compare-with``: each folder's families.json -> its shapes, labelled by its weights ("bf16", or
    the run's ``--quantized``; the folder's name added when two runs share one). Raises ValueError naming a
    folder without the file."""
    runs: dict[str, dict] = {}
    for folder in folders:
        path = Path(folder) / "families.json"
        if not path.is_file():
            raise ValueError(f"--compare-with {folder}: no families.json there")
        report = json.loads(path.read_text())
        label = report.get("quantized") or "bf16"
        runs[f"{label} ({Path(folder).name})" if label in runs else label] = report["shapes"]
    return runs


def print_summary(results: dict, compare: dict[str, list[dict]] | None = None) -> None:
    """The table: per shape and batch this run's decode figures (and, ``compare``, those of the other runs
    beside them with this run's speed-up), its verify costs or MTP oracle rows and kernel count."""
    beside = "   beside: other run tokens/s (of its floor), this run's speed-up" if compare else ""
    print(
        f"{'shape':24} {'batch':>5} {'tokens/s':>9} {'step ms':>8} {'of floor':>8} {'ms/layer':>8}"
        + beside
    )
    for name, r in results.items():
        if "decode" not in r:
            print(f"{name:24} {r.get('error') or r.get('not_run')}")
            continue
        for d in r["decode"]:
            if "skipped" in d:
                print(f"{name:24} {d['batch']:>5} skipped: {d['skipped']}")
                continue
            others = "".join(
                f"   {c['run']} {c['tokens_per_s']:.1f} ({c['fraction_of_floor']:.1%}) "
                f"x{c['speedup']:.2f}"
                for c in (compare or {}).get(name, [])
                if c["batch"] == d["batch"]
            )
            print(
                f"{name:24} {d['batch']:>5} {d['tokens_per_s']:>9.1f} {d['step_ms']:>8.2f} "
                f"{d['fraction_of_floor']:>8.1%} {d['step_ms_per_layer']:>8.3f}{others}"
            )
        if r["verify"]:
            verify = "; ".join(
                f"b{v['batch']}: " + " ".join(f"{x:.2f}" for x in v["relative"])
                for v in r["verify"]
            )
            print(f"{'':24} verify t=1..8 relative: {verify}")
        for key in ("verify_error", "mtp_error"):
            if key in r:
                print(f"{'':24} {key}: {r[key]}")
        for m in r.get("mtp_oracle", {}).get("rows", []):
            ms = " ".join(f"{v:.2f}" for v in m["step_ms"].values())
            best = "; ".join(
                f"a={o['acceptance']} k={o['num_drafts']} {o['speedup']:.2f}x"
                for o in m["speedups"]
            )
            print(f"{'':24} MTP b{m['batch']} step ms k=0..{len(m['step_ms']) - 1}: {ms}")
            print(f"{'':24}   {m['label']}: {best}")
        print(f"{'':24} kernels/step {r['kernels']['kernels']:.0f}")


def merge_reports(reports: list[dict]) -> dict:
    """families.json reports of runs over parts of the shapes -> one: the first's header, every shape's
    measured result (a later one wins), else its first entry (an error, not run)."""
    merged = {**reports[0], "shapes": {}}
    for report in reports:
        for name, shape in report["shapes"].items():
            if "decode" in shape or name not in merged["shapes"]:
                merged["shapes"][name] = shape
    return merged


def write_report(report: dict, out: Path, runs: dict[str, dict] | None = None) -> None:
    """families.json and families.png in ``out``; the table printed. ``runs`` (``read_runs``): the report's
    ``compare`` section made from them."""
    if runs:
        report["compare"] = compare_runs(report["shapes"], runs)
    (out / "families.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_families(report["shapes"], out / "families.png")
    print(f"weights: {report.get('quantized') or 'bf16'}")
    print_summary(report["shapes"], report.get("compare"))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default="benchmarks/results/families", help="folder of the JSON and PNG"
    )
    p.add_argument("--shapes", default=None, help=f"comma-separated, of {', '.join(ESTIMATE_S)}")
    p.add_argument(
        "--time-limit",
        type=float,
        default=480,
        help="seconds the shapes may take (bandwidth and start-up apart: 480 leaves a 10-minute "
        "device command room for them); shapes whose estimate no "
        "longer fits are listed as not run, and the same command into the same --out continues",
    )
    p.add_argument("--redo", action="store_true", help="measure again the shapes --out holds")
    p.add_argument(
        "--quantized",
        choices=sorted(QUANTIZATION_CONFIGS),
        default=None,
        help="the shapes with quantized weights (module docstring); use another --out than the bf16 run's",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="no n-gram verify sweep (its engine's build and graphs are about half a shape's time)",
    )
    p.add_argument(
        "--compare-with",
        nargs="+",
        default=None,
        metavar="DIR",
        help="the --out folders of other runs (the bf16 run, another quantization): their decode rows "
        "beside this run's in the table and the JSON's 'compare'",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="measure nothing: merge these families.json files (runs over parts of the shapes) "
        "into --out, plot and print them",
    )
    a = p.parse_args(argv)
    names = a.shapes.split(",") if a.shapes else None
    try:  # (refused before anything is measured)
        runs = read_runs(a.compare_with or [])
        if not a.merge:
            bench_shapes(a.quantized, names)
    except ValueError as e:
        p.error(str(e))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.merge:
        report = merge_reports([json.loads(Path(f).read_text()) for f in a.merge])
        write_report(report, out, runs)
        return report
    path = out / "families.json"
    previous = json.loads(path.read_text()) if path.is_file() and not a.redo else {}
    if previous and previous.get("quantized") != a.quantized:
        p.error(
            f"{path} holds a run with quantized={previous.get('quantized')}, not {a.quantized}: "
            "use another --out (or --redo)"
        )
    from outpace.bench.gpu import copy_bandwidth

    bandwidth = copy_bandwidth()
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "context": CONTEXT,
        "quantized": a.quantized,
        "shapes": previous.get("shapes", {}),
    }

    def save(results: dict) -> None:
        report["shapes"] = results
        path.write_text(json.dumps(report, indent=2) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        results = run_families_bench(
            Path(tmp),
            bandwidth,
            names,
            a.time_limit,
            report["shapes"],
            save,
            a.quantized,
            not a.no_verify,
        )
    report["shapes"] = results
    write_report(report, out, runs)
    return report


if __name__ == "__main__":
    main()
