"""GPU baseline (``outpace bench gpu``): the memory-bandwidth floor of batch-1 decoding and what
outpace's current GPU path achieves on a Llama-3.1-8B-shaped model with random bf16 weights.

Floor: a decode step must read every weight once, so steps/s <= copy bandwidth / weight bytes,
with the bandwidth measured in the same run by a large device-to-device copy (bytes read plus
bytes written). Decode is timed by the engine's own step loop after the prefill step.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from outpace import LLM, SamplingParams

LLAMA_8B = dict(architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                torch_dtype="bfloat16", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 8192})


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
    median = sorted(times[3:])[len(times[3:]) // 2]
    return 2 * num_bytes / median


def decode_tokens_per_s(llm: LLM, batch: int, context: int, steps: int) -> float:
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for i in range(batch):
        llm.engine.add_request([(7 * i + 13 * j) % vocab for j in range(context)], params)
    while any(r.num_output_tokens == 0 for r in llm.engine.scheduler.running) or llm.engine.scheduler.waiting:
        llm.engine.step()  # prefill (chunked) until every request has its first token
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while llm.engine.has_unfinished_requests:
        llm.engine.step()
        n += 1
    torch.cuda.synchronize()
    return batch * n / (time.perf_counter() - t0)


def run_gpu_baseline(out_json: Path, batch_sizes=(1, 8), contexts=(512,), steps: int = 32) -> dict:
    bandwidth = copy_bandwidth()
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(LLAMA_8B))
        llm = LLM(d, device="cuda", dtype="bfloat16", load_format="dummy", num_kv_blocks=4096, block_size=16,
                  max_num_seqs=64, max_num_batched_tokens=8192)
        weight_bytes = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
        floor = bandwidth / weight_bytes  # forwards/s
        decode_tokens_per_s(llm, 1, 64, 4)  # warm-up
        rows = []
        for context in contexts:
            for batch in batch_sizes:
                tps = decode_tokens_per_s(llm, batch, context, steps)
                rows.append({"batch": batch, "context": context, "decode_tokens_per_s": tps,
                             "steps_per_s": tps / batch, "fraction_of_floor": tps / batch / floor})
    result = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": bandwidth,
              "weight_bytes": weight_bytes, "floor_forwards_per_s": floor, "rows": rows,
              "path": "current outpace GPU path: torch SDPA backend over gathered paged KV, eager, no CUDA graphs"}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, weights {weight_bytes / 1e9:.2f} GB, "
          f"floor {floor:.1f} forwards/s")
    print(f"{'context':>8} {'batch':>6} {'tokens/s':>10} {'steps/s':>8} {'of floor':>9}")
    for r in rows:
        print(f"{r['context']:>8} {r['batch']:>6} {r['decode_tokens_per_s']:>10.1f} {r['steps_per_s']:>8.1f} "
              f"{r['fraction_of_floor']:>8.1%}")
    return result
