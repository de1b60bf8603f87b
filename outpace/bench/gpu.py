"""``outpace bench gpu``: outpace's GPU path against the memory-bandwidth floor, in one run.

(a) the floor: device-to-device copy bandwidth measured in this run (bytes read plus written) and
    the bytes one forward must read: every weight but the input embedding table (one row of it per
    token), plus the KV cache of every sequence;
(b) a Llama-3.1-8B-shaped model with random bf16 weights (built on the GPU, no download): decode
    tokens/s at batch 1, 8, 32, 64 and contexts 512 and 4096, and its fraction of the floor;
(c): speculation on the 8B shape with real acceptance is ``outpace bench e2e`` (bench/e2e.py);
(d) a DeepSeek-V2-Lite-shaped target (MLA + MoE, random bf16 weights): decode against the floor of the
    bytes actually read, the grouped-expert kernels against their experts' bytes, speculation under
    labelled oracle acceptance (bench/deepseek_shape.py);
(h) a Qwen3.5-shaped hybrid target (gated DeltaNet + gated attention, one MTP layer, random bf16 weights):
    decode at batch 1 and 8 against the floor, MTP step costs and speed-ups under labelled oracle
    acceptance (bench/hybrid_shape.py);
(s) every seed family at its public shape (DeepSeek-V2-Lite, DeepSeek-V3 / Kimi-K2 / Qwen3-Next /
    Step-3.5-Flash layer slices, Qwen3.5, Nemotron-H-8B, Gemma-3-12B, Gemma 4), random bf16 weights: decode
    against the floor, verify cost of 1..8 tokens, kernels per step (bench/families.py);
(e) transformers' ``generate`` on the same weights, batch 1, greedy;
(f) the zoo models end to end: tokens/s of each drafter against ``--method none`` on the 24 held-out
    prompts, b at a time (batch 1: one after another).
Decode rows time a fixed number of engine steps while every request of the batch is running.
"""

from __future__ import annotations

import gc
import json
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

LLAMA_8B = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
BATCHES, CONTEXTS = (1, 8, 32, 64), (512, 4096)


# ---- (a) the floor ------------------------------------------------------------------------------
def copy_bandwidth(num_bytes: int = 4 << 30, repeats: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written (median)."""
    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * num_bytes / _median(times[3:])


def weight_bytes_read(model) -> int:
    """Bytes of weights one forward reads: all parameters but the untied input embedding table."""
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total if tied else total - embed.numel() * embed.element_size()


def kv_bytes_per_token(cfg, dtype: torch.dtype) -> int:
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize


# ---- engines on the 8B shape ----------------------------------------------------------------
def engine_8b(
    workdir: Path,
    speculative: SpeculativeConfig | None = None,
    max_context: int = max(CONTEXTS),
    max_num_seqs: int = max(BATCHES),
    config: dict = LLAMA_8B,
    **engine,
) -> tuple[str, dict]:
    """(model directory, LLM keyword arguments) of the 8B-shaped target (or ``config``'s shape) with random
    weights and, when speculating, its draft; ``engine``: EngineConfig fields that override these (device,
    tensor_parallel_size). The config.json is written here, so that every rank of a tensor-parallel
    engine can build it from these two values alone."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(config))
    blocks = max_num_seqs * (-(-(max_context + 64) // 16)) + 64
    return str(workdir), {
        **dict(
            device="cuda",
            dtype="bfloat16",
            load_format="dummy",
            num_kv_blocks=blocks,
            block_size=16,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=8192,
            speculative=speculative or SpeculativeConfig(),
            cuda_graphs=True,
        ),
        **engine,
    }


def build_8b(
    workdir: Path,
    speculative: SpeculativeConfig | None = None,
    max_context: int = max(CONTEXTS),
    max_num_seqs: int = max(BATCHES),
    **engine,
) -> LLM:
    """The 8B-shaped target with random weights (and an EAGLE3 draft when speculating), graphs captured."""
    model, kwargs = engine_8b(workdir, speculative, max_context, max_num_seqs, **engine)
    return LLM(model, **kwargs)


def start_decoding(llm: LLM, batch: int, context: int, max_tokens: int) -> list[str]:
    """``batch`` greedy requests of ``context`` distinct prompt tokens each, prefilled and a few steps into
    decoding (every later engine step a decode step of the whole batch); their request ids."""
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [
        engine.add_request([(7 * i + 13 * j + 1) % vocab for j in range(context)], params)
        for i in range(batch)
    ]
    while (
        any(r.num_output_tokens == 0 for r in engine.scheduler.running) or engine.scheduler.waiting
    ):
        engine.step()  # prefill (chunked) until every request has its first token
    for _ in range(3):
        engine.step()  # warm-up: the first decode steps hand state to the captured iteration
    return ids


def time_decode(llm: LLM, batch: int, context: int, steps: int = 24) -> dict:
    """Engine steps/s and tokens/s over ``steps`` steps with every request of the batch running."""
    engine = llm.engine
    ids = start_decoding(llm, batch, context, max_tokens=64 * steps)
    # Timed from one step's return to another's: a step returns once its tokens are on the host, so
    # this is the steady rate with any step run ahead (runner.py) in flight at both ends alike.
    before = sum(r.num_output_tokens for r in engine.scheduler.running)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = time.perf_counter() - t0
    running = engine.scheduler.running
    if len(running) != batch:
        raise RuntimeError(
            f"only {len(running)} of {batch} requests ran through the timed steps (KV pool too small?)"
        )
    tokens = sum(r.num_output_tokens for r in running) - before
    for rid in ids:
        engine.abort_request(rid)
    return {
        "batch": batch,
        "context": context,
        "steps": steps,
        "step_ms": 1e3 * elapsed / steps,
        "tokens_per_s": tokens / elapsed,
        "tokens_per_step": tokens / steps / batch,
    }


# ---- (e) transformers ---------------------------------------------------------------------------
def transformers_generate(model, context: int = 512, new_tokens: int = 64) -> dict:
    """transformers' LlamaForCausalLM sharing outpace's weights: greedy ``generate`` at batch 1.
    Decode tokens/s = (new_tokens - 1) / (time(new_tokens) - time(1 token)), prefill cancelled out."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(**{k: v for k, v in LLAMA_8B.items() if k != "architectures"})
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    missing, unexpected = hf.load_state_dict(model.state_dict(), assign=True, strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"weights do not map onto transformers' Llama: missing {missing}, unexpected {unexpected}"
        )
    hf.model.rotary_emb = LlamaRotaryEmbedding(
        config=config, device="cuda"
    )  # its buffers were on meta
    hf = hf.eval()
    prompt = torch.randint(0, 128000, (1, context), device="cuda")

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(4)  # warm-up
    one = _median([timed(1) for _ in range(3)])
    full = _median([timed(new_tokens) for _ in range(2)])
    return {
        "context": context,
        "new_tokens": new_tokens,
        "decode_tokens_per_s": (new_tokens - 1) / (full - one),
        "attn_implementation": hf.config._attn_implementation,
    }


# ---- (f) the zoo ----------------------------------------------------------------------------------
ZOO_DRAFTERS = {
    "eagle3": SpeculativeConfig(method="eagle3", draft="zoo/tinypy-eagle3", num_steps=5),
    "eagle3-tree": SpeculativeConfig(
        method="eagle3", draft="zoo/tinypy-eagle3", num_steps=5, topk=4, num_draft_tokens=16
    ),
    "mtp": SpeculativeConfig(method="mtp", num_steps=3),
    "dflash": SpeculativeConfig(method="dflash", draft="zoo/tinypy-dflash", num_steps=7),
    "draft": SpeculativeConfig(method="draft", draft="zoo/tinypy-draft", num_steps=4),
    "ngram": SpeculativeConfig(method="ngram", num_steps=4),
}


def zoo_speed(batches=(1, 8), max_tokens: int = 128, repeats: int = 3) -> list[dict]:
    """Each zoo drafter against --method none, bf16 on the GPU, on all the zoo's held-out prompts: at
    batch b they run b at a time (consecutive groups of b prompts, each group to the end), so batch 1
    is every prompt alone, one after another. Plain decoding of this tiny target is bound by the
    host, whose speed drifts within a run, so every engine stays loaded and the methods take turns,
    ``repeats`` rounds; a row's tokens/s is the median of its rounds."""
    prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llms = {}
    for name, spec in tqdm(
        {"none": SpeculativeConfig(), **ZOO_DRAFTERS}.items(), desc="(f) zoo engines"
    ):
        llms[name] = LLM(
            "zoo/tinypy",
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=max(batches),
            speculative=spec,
        )
        for (
            b
        ) in batches:  # warm-up: every prompt's prefill shapes compiled, every batch bucket used
            for i in range(0, len(prompts), b):
                llms[name].generate(prompts[i : i + b], params.replace(max_tokens=8))
    rounds: dict[tuple[str, int], list[float]] = {}
    tau: dict[tuple[str, int], float | None] = {}
    for _ in tqdm(range(repeats), desc="(f) zoo rounds"):
        for b in batches:
            for name, llm in llms.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs = [
                    o
                    for i in range(0, len(prompts), b)
                    for o in llm.generate(prompts[i : i + b], params)
                ]
                elapsed = time.perf_counter() - t0
                rounds.setdefault((name, b), []).append(
                    sum(len(o.token_ids) for o in outs) / elapsed
                )
                verifies = sum(o.spec_metrics.num_verifies for o in outs)
                tau[name, b] = (
                    (sum(o.spec_metrics.num_accepted_drafts for o in outs) / verifies + 1)
                    if verifies
                    else None
                )
    rows = [
        {
            "method": name,
            "batch": b,
            "prompts": len(prompts),
            "tokens_per_s": _median(rates),
            "tokens_per_s_rounds": rates,
            "acceptance_length": tau[name, b],
        }
        for b in batches
        for name in llms
        for rates in [rounds[name, b]]
    ]
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["method"] == "none"}
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base[r["batch"]]
    return rows


# ---- the run --------------------------------------------------------------------------------------
def run_gpu_bench(
    out_dir: Path,
    parts: str = "abef",
    shapes: list[str] | None = None,
    time_limit_s: float | None = None,
) -> dict:
    """Run the requested parts; the JSON is rewritten after each one, and a part that fails records
    its error and lets the others run. ``shapes`` and ``time_limit_s``: part (s)'s shapes (all by default)
    and the seconds they may take (bench/families.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": "Llama-3.1-8B shape, random bf16 weights",
        "errors": {},
    }

    def save() -> None:
        (out_dir / "gpu_bench.json").write_text(json.dumps(result, indent=2) + "\n")

    def part(name: str, fn) -> None:
        if name not in parts:
            return
        try:
            fn()
        except Exception as e:  # one broken part must not cost the others' figures
            result["errors"][name] = f"{type(e).__name__}: {e}"
            print(f"part ({name}) failed: {result['errors'][name]}")
        save()

    result["copy_bandwidth_bytes_per_s"] = bandwidth = copy_bandwidth()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "b" in parts or "e" in parts:
            llama_8b_parts(result, part, tmp, bandwidth)
            gc.collect()  # the 8B model freed before the next part
            torch.cuda.empty_cache()

        def deepseek() -> None:
            from outpace.bench.deepseek_shape import run_deepseek_bench

            result["deepseek"] = run_deepseek_bench(tmp / "deepseek", bandwidth)

        part("d", deepseek)
        gc.collect()
        torch.cuda.empty_cache()

        def hybrid() -> None:
            from outpace.bench.hybrid_shape import run_hybrid_bench

            result["hybrid"] = run_hybrid_bench(tmp / "hybrid", bandwidth)

        part("h", hybrid)
        gc.collect()
        torch.cuda.empty_cache()

        def families() -> None:
            from outpace.bench.families import plot_families, run_families_bench

            result["families"] = run_families_bench(
                tmp / "families", bandwidth, shapes, time_limit_s
            )
            plot_families(result["families"], out_dir / "families.png")

        part("s", families)

    def zoo() -> None:
        result["zoo"] = zoo_speed()

    part("f", zoo)
    from outpace.bench.gpu_plots import plot_gpu_bench

    plot_gpu_bench(result, out_dir)
    print_summary(result)
    return result


def llama_8b_parts(result: dict, part, tmp: Path, bandwidth: float) -> None:
    """Parts (b) and (e), on the 8B shape built once for both."""
    llm = build_8b(tmp / "target")
    model = llm.engine.model
    weights = weight_bytes_read(model)
    kv_token = kv_bytes_per_token(llm.engine.model_config, torch.bfloat16)
    result.update(
        weight_bytes_total=sum(p.numel() * p.element_size() for p in model.parameters()),
        weight_bytes_read=weights,
        kv_bytes_per_token=kv_token,
        floor_forwards_per_s_batch1_no_kv=bandwidth / weights,
    )

    def decode() -> None:
        rows = result["decode"] = []
        for context in CONTEXTS:
            for batch in tqdm(BATCHES, desc=f"(b) decode, context {context}"):
                r = time_decode(llm, batch, context)
                r["floor_steps_per_s"] = bandwidth / (weights + batch * context * kv_token)
                r["fraction_of_floor"] = (1e3 / r["step_ms"]) / r["floor_steps_per_s"]
                rows.append(r)

    def reference() -> None:
        result["transformers_generate"] = transformers_generate(model)

    part("b", decode)
    part("e", reference)


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def print_summary(r: dict) -> None:
    print(f"\ncopy bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s")
    if "weight_bytes_read" in r:
        print(
            f"8B shape: weights read per forward {r['weight_bytes_read'] / 1e9:.2f} GB (of "
            f"{r['weight_bytes_total'] / 1e9:.2f} GB); batch-1 floor {r['floor_forwards_per_s_batch1_no_kv']:.1f} "
            f"forwards/s before KV"
        )
    if "decode" in r:
        print(f"(b) {'context':>7} {'batch':>5} {'tokens/s':>9} {'step ms':>8} {'of floor':>8}")
        for x in r["decode"]:
            print(
                f"    {x['context']:>7} {x['batch']:>5} {x['tokens_per_s']:>9.1f} {x['step_ms']:>8.2f} "
                f"{x['fraction_of_floor']:>8.1%}"
            )
    if "transformers_generate" in r:
        print(
            f"(e) transformers generate, batch 1: {r['transformers_generate']['decode_tokens_per_s']:.1f} tokens/s"
        )
    if "hybrid" in r:
        from outpace.bench.hybrid_shape import print_hybrid_summary

        print_hybrid_summary(r["hybrid"])
    if "deepseek" in r:
        from outpace.bench.deepseek_shape import print_deepseek_summary

        print_deepseek_summary(r["deepseek"])
    if "families" in r:
        from outpace.bench.families import print_summary as print_families_summary

        print_families_summary(r["families"])
    if "zoo" in r:
        print(
            "(f) zoo: "
            + "; ".join(
                f"{x['method']} b{x['batch']} {x['tokens_per_s']:.0f} tok/s {x['speedup']:.2f}x"
                for x in r["zoo"]
            )
        )
