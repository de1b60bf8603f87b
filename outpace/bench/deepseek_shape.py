"""``outpace bench gpu --parts d``: a DeepSeek-V2-Lite-shaped target (MLA + MoE) with random bf16 weights on
the GPU, against the floor of the bytes a forward actually reads, in one run.

The shape is DeepSeek-V2-Lite's config.json (huggingface.co/deepseek-ai/DeepSeek-V2-Lite; its model card:
27 layers, hidden 2048, 16 heads, KV compression 512, 2 shared + 64 routed experts of 1408, 6 active, 15.7B
total and 2.4B active parameters; the same values appear in public config-parsing tests of other engines):
random weights (``load_format="dummy"``), no download. Random weights route tokens to experts much as a
uniform draw would, so the experts a batch reads are counted, not assumed.

- floor: device copy bandwidth measured in this run (bytes read plus written, bench/gpu.py), and the bytes
  a forward of b sequences x t tokens at context c reads: every weight except the input embedding table
  (b * t rows of it) and the routed experts (only the distinct experts the batch's tokens chose in each
  layer, counted on a forward of the same shape), plus the latent cache (one [kv_lora_rank + rope] row
  per token and layer);
- decode: engine steps through the captured iteration (the MLA kernel and the grouped-expert kernels
  inside the graph) at batch 1, 8, 32, contexts 512 and 4096: tokens/s and the fraction of the floor;
- grouped experts: the kernels alone at t = 1 and k+1 = 4..8 tokens (one call per MoE layer, replayed in
  a CUDA graph), time against the bytes of the experts they read; the eager per-expert loop beside them;
- speculation under oracle acceptance (LABELLED: the acceptance is assumed, not measured; this target has
  no trained MTP layer or EAGLE3 draft): captured target forwards over t = 1 .. 8 tokens per sequence
  (verify cost), and the cost of one draft step (MTP: a MoE decoder layer and the head; EAGLE3-like: the
  dense decoder layer and the head), measured; tokens/s = b * tau / (T_verify(k + 1) + k * T_draft) with
  tau = (1 - a^(k+1)) / (1 - a) for a per-position acceptance a, against plain decoding's b / T_verify(1)
  from the same forward timings, at the best k for each method.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from outpace import LLM
from outpace.attention import forward_context, uniform_paged_metadata
from outpace.attention.registry import get_backend
from outpace.bench.oracle import ORACLE_ACCEPTANCE, best_draft_count, expected_tokens
from outpace.engine.cuda_graphs import CapturedCall
from outpace.layers.moe import MoE, run_experts, shared_expert_stacks
from outpace.layers.router import Router

V2_LITE = dict(
    architectures=["DeepseekV2ForCausalLM"],
    model_type="deepseek_v2",
    vocab_size=102400,
    hidden_size=2048,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    topk_method="greedy",
    n_group=1,
    topk_group=1,
    scoring_func="softmax",
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    hidden_act="silu",
    max_position_embeddings=163840,
    rms_norm_eps=1e-6,
    rope_theta=10000,
    rope_scaling={
        "type": "yarn",
        "factor": 40,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
    },
    attention_bias=False,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
    bos_token_id=100000,
    eos_token_id=100001,
)
BATCHES, CONTEXTS = (1, 8, 32), (512, 4096)
# grouped-expert sweep: tokens per call (batch x verify width)
EXPERT_TOKENS = (1, 2, 4, 8, 16, 32, 64)
VERIFY_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)  # target forward: tokens per sequence
MAX_DRAFTS = {"mtp": 3, "eagle3": 7}


# ---- the model ------------------------------------------------------------------------------------
def build_v2_lite(
    workdir: Path, max_context: int = max(CONTEXTS), max_num_seqs: int = max(BATCHES)
) -> LLM:
    """The V2-Lite-shaped target, random bf16 weights, the decode iteration captured per batch bucket."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(V2_LITE))
    blocks = max_num_seqs * (-(-(max_context + 64) // 16)) + 64
    llm = LLM(
        str(workdir),
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        num_kv_blocks=blocks,
        block_size=16,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192,
        cuda_graphs=False,
    )
    llm.engine.capture_graphs()
    return llm


def byte_budget(model) -> dict:
    """Bytes of the parts a forward reads: the weights outside the routed experts and the embedding table
    (all read by any forward), one routed expert, one embedding row, a latent-cache row of all layers."""
    params = dict(model.named_parameters())
    routed = {n: p for n, p in params.items() if ".mlp.experts." in n}
    moe_layers = [m for m in model.model.layers if isinstance(m.mlp, MoE)]
    expert = sum(p.numel() * p.element_size() for p in moe_layers[0].mlp.experts[0].parameters())
    embed = model.model.embed_tokens.weight
    always = (
        sum(p.numel() * p.element_size() for n, p in params.items() if n not in routed)
        - embed.numel() * embed.element_size()
    )
    attn = model.model.layers[0].self_attn
    cache_row = sum(
        layer.self_attn.cache_rows[0, 0].numel() * layer.self_attn.cache_rows.element_size()
        for layer in model.model.layers
    )
    return {
        "total_params": sum(p.numel() for p in params.values()),
        "always_read_bytes": always,
        "expert_bytes": expert,
        "moe_layers": len(moe_layers),
        "embedding_row_bytes": embed[0].numel() * embed.element_size(),
        "latent_cache_bytes_per_token": cache_row,
        "attention_bytes_per_layer": sum(p.numel() * p.element_size() for p in attn.parameters()),
    }


def floor_seconds(
    budget: dict, bandwidth: float, batch: int, tokens: int, context: int, distinct: float
) -> float:
    """The time to read what a forward of ``batch`` sequences x ``tokens`` at ``context`` reads, with
    ``distinct`` routed experts per MoE layer on average, at the copy bandwidth."""
    read = (
        budget["always_read_bytes"]
        + batch * tokens * budget["embedding_row_bytes"]
        + budget["moe_layers"] * distinct * budget["expert_bytes"]
        + batch * (context + tokens) * budget["latent_cache_bytes_per_token"]
    )
    return read / bandwidth


# ---- captured forwards -----------------------------------------------------------------------------
class CountExperts:
    """Router hooks recording, per call, how many distinct experts the call's tokens chose (eager only:
    the count synchronises)."""

    def __init__(self, model) -> None:
        self.counts: list[int] = []
        self.hooks = [
            m.register_forward_hook(
                lambda _m, _i, out: self.counts.append(int(out[1].unique().numel()))
            )
            for m in model.modules()
            if isinstance(m, Router)
        ]

    def close(self) -> float:
        for h in self.hooks:
            h.remove()
        return sum(self.counts) / max(1, len(self.counts))


def _time_replays(call: CapturedCall, repeats: int = 30) -> float:
    """Median seconds of a replay."""
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times = sorted(times[3:])
    return times[len(times) // 2]


def _static_batch(llm: LLM, batch: int, tokens: int, context: int):
    """(block tables, starts, token ids, positions) on the device for ``batch`` sequences of ``context``
    cached rows bringing ``tokens`` each, in free blocks of the engine's pool (no request is running)."""
    block_size = llm.engine.pool.block_size
    per_seq = -(-(context + tokens) // block_size)
    if batch * per_seq + 1 > llm.engine.pool.num_blocks:
        raise RuntimeError("the KV pool is too small for the forward timings")
    tables = (1 + torch.arange(batch * per_seq, device="cuda")).view(
        batch, per_seq
    )  # block 0 left alone
    starts = torch.full((batch,), context, dtype=torch.int64, device="cuda")
    ids = torch.randint(0, V2_LITE["vocab_size"], (batch * tokens,), device="cuda")
    positions = (starts[:, None] + torch.arange(tokens, device="cuda")).reshape(-1)
    return tables, starts, ids, positions


def time_forward(
    llm: LLM, batch: int, tokens: int, context: int, layers: list[int] | None = None
) -> dict:
    """A captured forward of ``batch`` sequences x ``tokens`` (causal, as a chain verify) at ``context``:
    the whole target and its greedy tokens, or (``layers``) only those decoder layers and the head (a draft
    step's cost). Returns seconds and the distinct experts per MoE layer its tokens chose."""
    model = llm.engine.model
    tables, starts, ids, positions = _static_batch(llm, batch, tokens, context)
    backend = get_backend("triton")

    def forward():
        meta = uniform_paged_metadata(tables, starts, tokens, llm.engine.pool.block_size)
        with torch.inference_mode(), forward_context(meta, backend):
            if layers is None:
                hidden = model(ids, positions).hidden_states
            else:
                hidden = model.embed(ids)
                for i in layers:
                    hidden = model.model.layers[i](positions, hidden)
            return model.compute_logits(hidden).argmax(dim=-1)

    counter = CountExperts(model)
    forward()
    distinct = counter.close()
    seconds = _time_replays(CapturedCall(forward, torch.device("cuda")))
    return {
        "batch": batch,
        "tokens": tokens,
        "context": context,
        "layers": layers,
        "seconds": seconds,
        "distinct_experts": distinct,
    }


def time_grouped_experts(model, tokens: int, bandwidth: float, budget: dict) -> dict:
    """``time_moe_layers`` over every MoE layer of the model (``budget`` unused: the layers' own bytes)."""
    return time_moe_layers(
        [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, MoE)], tokens, bandwidth
    )


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def time_moe_layers(moes: list[MoE], tokens: int, bandwidth: float) -> dict:
    """``tokens`` random hidden states through each of ``moes`` (one captured replay runs every layer, so
    no layer's experts are still in L2 when it runs again), seconds per layer:
    - ``seconds``: the grouped-expert kernels alone (layers/moe_kernels.py: align, gate/up, down, combine),
      the shared experts fused, on uniform random routing, against ``bytes_read``: the distinct routed
      experts the routing chose plus the shared experts, each read once;
    - ``block_seconds``: the whole MoE block on the kernels (routing kernels with the layout, the same
      grouped kernels), against its own distinct experts (the router's choice) plus the router weight;
    - ``eager_loop_seconds``: run_experts (one call per expert in use, a host sync) plus the shared MLP."""
    from outpace.layers.grouped_experts import grouped_experts

    first = moes[0]
    r, hidden = first.gate.routing, first.gate.weight.shape[1]
    dtype = first.experts.stacks()[2].dtype
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=g)
    routing = []
    for _ in moes:
        ids = torch.rand(tokens, r.num_experts, device="cuda", generator=g).argsort(dim=-1)
        routing.append((torch.rand(tokens, r.top_k, device="cuda", generator=g), ids[:, : r.top_k]))
    shared = [shared_expert_stacks(m.shared_experts, m.experts) for m in moes]
    stacked = [m.experts.stacks() for m in moes]
    expert_bytes = _bytes(first.experts[0])
    shared_bytes = 0 if first.shared_experts is None else _bytes(first.shared_experts)
    router_bytes = first.gate.weight.numel() * 4 + r.num_experts * 4 * r.correction_bias

    def grouped():
        with torch.inference_mode():
            return [
                grouped_experts(x, w, ids, *st, shared=sh)
                for (w, ids), st, sh in zip(routing, stacked, shared)
            ]

    def block():
        with torch.inference_mode():
            return [m(x) for m in moes]

    with torch.inference_mode():
        chosen = [m.gate(x)[1] for m in moes]
    distinct = sum(ids.unique().numel() for _, ids in routing) / len(moes)
    block_distinct = sum(ids.unique().numel() for ids in chosen) / len(moes)
    seconds = _time_replays(CapturedCall(grouped, torch.device("cuda"))) / len(moes)
    block_seconds = _time_replays(CapturedCall(block, torch.device("cuda"))) / len(moes)
    with torch.inference_mode():
        run_experts(x, *routing[0], first.experts)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for (w, ids), m in zip(routing, moes):
            out = run_experts(x, w, ids, m.experts)
            if m.shared_experts is not None:
                out = out + m.shared_experts(x)
        torch.cuda.synchronize()
    eager = (time.perf_counter() - t0) / len(moes)
    read = distinct * expert_bytes + shared_bytes
    block_read = block_distinct * expert_bytes + shared_bytes + router_bytes
    return {
        "tokens": tokens,
        "distinct_experts": distinct,
        "bytes_read": read,
        "seconds": seconds,
        "bytes_per_s": read / seconds,
        "fraction_of_copy_bandwidth": read / seconds / bandwidth,
        "block_distinct_experts": block_distinct,
        "block_bytes_read": block_read,
        "block_seconds": block_seconds,
        "block_fraction_of_copy_bandwidth": block_read / block_seconds / bandwidth,
        "eager_loop_seconds": eager,
    }


def moe_sweep(layers: int = 26, tokens: tuple[int, ...] = EXPERT_TOKENS) -> list[dict]:
    """The grouped-expert sweep without the engine: ``layers`` DeepSeek-V2-Lite MoE blocks (64 routed
    experts of 1408, 6 active, 2 shared; random bf16 weights) built directly, ``time_moe_layers`` at each
    token count, printed (``python -c "from outpace.bench.deepseek_shape import moe_sweep; moe_sweep()"``)."""
    from outpace.bench.gpu import copy_bandwidth
    from outpace.layers.decoder import GatedMLP
    from outpace.layers.router import Routing

    c = V2_LITE
    routing = Routing(c["n_routed_experts"], c["num_experts_per_tok"], c["scoring_func"])
    hidden = c["hidden_size"]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"), torch.no_grad():
            moes = [
                MoE(
                    hidden,
                    routing,
                    c["moe_intermediate_size"],
                    c["n_shared_experts"],
                    lambda size, bias, **_: GatedMLP(hidden, size, "silu", bias),
                )
                for _ in range(layers)
            ]
            for m in moes:
                m.gate.weight.normal_(0.0, hidden**-0.5)
    finally:
        torch.set_default_dtype(default)
    bandwidth = copy_bandwidth()
    rows = [time_moe_layers(moes, t, bandwidth) for t in tokens]
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s; per MoE layer:")
    print(
        f"{'tokens':>6} {'experts':>7} {'MB':>6} {'grouped us':>10} {'of bw':>6} {'block us':>8} {'of bw':>6}"
    )
    for x in rows:
        print(
            f"{x['tokens']:>6} {x['distinct_experts']:>7.1f} {x['bytes_read'] / 1e6:>6.1f} "
            f"{x['seconds'] * 1e6:>10.1f} {x['fraction_of_copy_bandwidth']:>6.1%} "
            f"{x['block_seconds'] * 1e6:>8.1f} {x['block_fraction_of_copy_bandwidth']:>6.1%}"
        )
    return rows


# ---- speculation under oracle acceptance -----------------------------------------------------------
def oracle_speedups(
    verify: dict[tuple[int, int], float], draft: dict[tuple[str, int], float]
) -> list[dict]:
    """verify[(batch, tokens)] and draft[(method, batch)] seconds -> per method, batch and acceptance: the
    best k's tokens/s against plain decoding (module docstring's model; acceptance assumed)."""
    rows = []
    for (method, batch), step in sorted(draft.items()):
        plain = batch / verify[batch, 1]
        costs = {
            k: verify[batch, k + 1] + k * step
            for k in range(1, MAX_DRAFTS[method] + 1)
            if (batch, k + 1) in verify
        }  # a step of k drafts, seconds
        for a in ORACLE_ACCEPTANCE:
            k, speedup = best_draft_count(costs, verify[batch, 1], a)
            rows.append(
                {
                    "method": method,
                    "batch": batch,
                    "oracle_acceptance": a,
                    "num_steps": k,
                    "tau": expected_tokens(a, k),
                    "tokens_per_s": plain * speedup,
                    "plain_tokens_per_s": plain,
                    "speedup": speedup,
                    "draft_step_seconds": step,
                    "label": "oracle acceptance (assumed), costs measured",
                }
            )
    return rows


# ---- the part ---------------------------------------------------------------------------------------
def run_deepseek_bench(workdir: Path, bandwidth: float) -> dict:
    """Every measurement of this module (docstring), as one dict for bench/gpu.py's JSON."""
    from outpace.bench.gpu import time_decode

    llm = build_v2_lite(workdir)
    model = llm.engine.model
    budget = byte_budget(model)
    result: dict = {
        "model": "DeepSeek-V2-Lite shape, random bf16 weights",
        "config": V2_LITE,
        "bytes": budget,
    }
    verify, drafts, forwards = {}, {}, []
    for batch in tqdm(BATCHES, desc="(d) DeepSeek forwards"):
        for tokens in VERIFY_TOKENS:
            r = time_forward(llm, batch, tokens, 512)
            r["floor_seconds"] = floor_seconds(
                budget, bandwidth, batch, tokens, 512, r["distinct_experts"]
            )
            r["fraction_of_floor"] = r["floor_seconds"] / r["seconds"]
            forwards.append(r)
            verify[batch, tokens] = r["seconds"]
        drafts["mtp", batch] = time_forward(llm, batch, 1, 512, layers=[1])[
            "seconds"
        ]  # a MoE layer + head
        drafts["eagle3", batch] = time_forward(llm, batch, 1, 512, layers=[0])[
            "seconds"
        ]  # the dense layer + head
    result["forwards"] = forwards
    result["oracle_speculation"] = oracle_speedups(verify, drafts)
    result["grouped_experts"] = [
        time_grouped_experts(model, t, bandwidth, budget)
        for t in tqdm(EXPERT_TOKENS, desc="(d) grouped experts")
    ]
    distinct = {r["batch"]: r["distinct_experts"] for r in forwards if r["tokens"] == 1}
    decode = result["decode"] = []
    for context in CONTEXTS:
        for batch in tqdm(BATCHES, desc=f"(d) DeepSeek decode, context {context}"):
            r = time_decode(llm, batch, context)
            r["distinct_experts"] = distinct[batch]
            r["floor_steps_per_s"] = 1 / floor_seconds(
                budget, bandwidth, batch, 1, context, distinct[batch]
            )
            r["fraction_of_floor"] = (1e3 / r["step_ms"]) / r["floor_steps_per_s"]
            decode.append(r)
    return result


def print_deepseek_summary(r: dict) -> None:
    b = r["bytes"]
    print(
        f"(d) {r['model']}: {b['total_params'] / 1e9:.1f}B parameters; always read {b['always_read_bytes'] / 1e9:.2f} GB,"
        f" {b['expert_bytes'] / 1e6:.1f} MB per routed expert x {b['moe_layers']} MoE layers"
    )
    print(
        f"    decode {'context':>7} {'batch':>5} {'tokens/s':>9} {'step ms':>8} {'experts':>7} {'of floor':>8}"
    )
    for x in r.get("decode", []):
        print(
            f"           {x['context']:>7} {x['batch']:>5} {x['tokens_per_s']:>9.1f} {x['step_ms']:>8.2f} "
            f"{x['distinct_experts']:>7.1f} {x['fraction_of_floor']:>8.1%}"
        )
    print(
        f"    grouped experts {'tokens':>6} {'experts':>7} {'us':>7} {'GB/s':>7} {'of copy bw':>10} {'eager us':>8}"
    )
    for x in r.get("grouped_experts", []):
        print(
            f"                    {x['tokens']:>6} {x['distinct_experts']:>7.1f} {x['seconds'] * 1e6:>7.1f} "
            f"{x['bytes_per_s'] / 1e9:>7.0f} {x['fraction_of_copy_bandwidth']:>10.1%} "
            f"{x['eager_loop_seconds'] * 1e6:>8.0f}"
        )
    print(
        "    forward (context 512): "
        + "; ".join(
            f"b{x['batch']} t{x['tokens']} {x['seconds'] * 1e3:.2f} ms "
            f"({x['fraction_of_floor']:.0%})"
            for x in r.get("forwards", [])
        )
    )
    print(
        "    ORACLE acceptance (assumed), measured costs: "
        + "; ".join(
            f"{x['method']} b{x['batch']} a={x['oracle_acceptance']} k={x['num_steps']} {x['speedup']:.2f}x"
            for x in r.get("oracle_speculation", [])
        )
    )


if __name__ == "__main__":  # python -m outpace.bench.deepseek_shape OUT_DIR: this part alone
    import sys
    import tempfile

    from outpace.bench.gpu import copy_bandwidth

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/gpu_bench")
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    with tempfile.TemporaryDirectory() as tmp:
        res = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "copy_bandwidth_bytes_per_s": bw,
            "deepseek": run_deepseek_bench(Path(tmp), bw),
        }
    (out / "deepseek_bench.json").write_text(json.dumps(res, indent=2) + "\n")
    print_deepseek_summary(res["deepseek"])
