"""A draft step's head with and without a token map (speculative/hot_vocab.py ``Readout``), alone on the GPU: the
greedy drafts (the head with its argmax folded in, layers/fused_decoder.py ``head_argmax_tokens``) and the sampled
drafts' logits (through a map, scattered into the whole vocabulary) of 1, 8 and 32 rows, over the
heads of Qwen3-Next / Qwen3.5 (151,936 x 2,048), Llama-3 (128,256 x 4,096) and DeepSeek-V3 / Kimi-K2 (129,280 x
7,168; 163,840 x 7,168) in bf16, each against a map of 32,768 tokens (FR-Spec's largest). Each call's share of a CUDA
graph of 20 calls, the best of 5 replays; the floor is the head's bytes over the copy bandwidth measured here.

    python benchmarks/scripts/hot_head_speed.py [--hot 32768] [--rows 1 8 32] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from outpace.layers.embedding import LMHead
from outpace.layers.norm import RMSNorm
from outpace.speculative.hot_vocab import HotHead, Readout

HEADS = {  # vocabulary, hidden (each model's hub config.json)
    "qwen3-next": (151936, 2048),
    "llama-3": (128256, 4096),
    "deepseek-v3": (129280, 7168),
    "kimi-k2": (163840, 7168),
}
CALLS = 20


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device copy, best of 5."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * a.numel() / best


def timed(fn) -> float:
    """Microseconds a call of ``fn``: its share of a CUDA graph of CALLS calls, the best of 5 replays."""
    for _ in range(3):
        fn()  # (compiles, outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / CALLS)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hot", type=int, default=32768)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(
        f"{'head':<12}{'rows':>5}  {'greedy full / hot us':>22}  {'logits full / hot us':>22}  floor full / hot"
    )
    out = []
    for name, (vocab, hidden) in HEADS.items():
        torch.manual_seed(0)
        head = LMHead(hidden, vocab).to("cuda", torch.bfloat16)
        torch.nn.init.normal_(head.weight, std=0.02)
        norm = RMSNorm(hidden, 1e-6).to("cuda", torch.bfloat16)
        full, hot = (
            Readout(norm, head),
            HotHead(head, torch.randperm(vocab, device="cuda")[: a.hot]),
        )
        mapped = Readout(norm, head, hot)
        floors = [w.numel() * w.element_size() / bandwidth * 1e6 for w in (head.weight, hot.weight)]
        for rows in a.rows:
            h = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            row = {
                "head": name,
                "rows": rows,
                "greedy_full_us": timed(lambda: full.greedy_tokens(h)),
                "greedy_hot_us": timed(lambda: mapped.greedy_tokens(h)),
                "logits_full_us": timed(lambda: full.logits(h)),
                "logits_hot_us": timed(lambda: mapped.logits(h)),
                "floor_full_us": floors[0],
                "floor_hot_us": floors[1],
            }
            out.append(row)
            print(
                f"{name:<12}{rows:>5}  {row['greedy_full_us']:>10.1f} / {row['greedy_hot_us']:<9.1f}  "
                f"{row['logits_full_us']:>10.1f} / {row['logits_hot_us']:<9.1f}  "
                f"{floors[0]:.1f} / {floors[1]:.1f}"
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "bandwidth": bandwidth, "rows": out}, f
            )


if __name__ == "__main__":
    main()
