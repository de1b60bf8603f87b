"""What prefix caching gives a hybrid target (its recurrent state checkpointed at block boundaries,
cache/state_checkpoints.py): requests that share a long system prompt, each with a question of its own, on a
widened family of ``bench e2e`` (Qwen3.5 by default: gated DeltaNet and gated attention; bf16 on the GPU, the
tiny widening in float32 on a CPU), with prefix caching on and off (one engine at a time). Two workloads: the
requests one after another (a chat's turns: the time to each one's first token), and all of them at once (the
batch's wall time). The first request of each engine warms the cache (with it on) and is not counted.

    PYTHONPATH=. python benchmarks/scripts/shared_prefix_ttft.py [--family qwen35] [--tiny] [--workdir .e2e]
        [--prefix-tokens 1024] [--requests 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from outpace import SamplingParams
from outpace.bench.e2e import bench_device, drafters, target_llm, widened_zoo


def prompts(vocab: int, prefix_tokens: int, requests: int, suffix_tokens: int) -> list[list[int]]:
    """One shared prefix, then ``requests`` prompts: the prefix and a suffix of their own (ids from a fixed
    generator, away from the special tokens at the ends of the vocabulary)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(
        100, vocab - 100, (prefix_tokens + (requests + 1) * suffix_tokens,), generator=gen
    )
    prefix = ids[:prefix_tokens].tolist()
    tails = ids[prefix_tokens:].view(requests + 1, suffix_tokens).tolist()
    return [prefix + tail for tail in tails]


def measure(llm, batch: list[list[int]], max_tokens: int) -> dict:
    """The first prompt alone (warm-up), the rest one by one (TTFT each), then the rest together (wall)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(batch[:1], params)
    ttfts = [llm.generate([p], params)[0].metrics.time_to_first_token for p in batch[1:]]
    start = time.perf_counter()
    together = llm.generate(batch[1:], params)
    wall = time.perf_counter() - start
    stats = llm.engine.prefix_cache_stats
    return {
        "ttft_ms_median": 1e3 * statistics.median(ttfts),
        "ttft_ms": [1e3 * t for t in ttfts],
        "together_s": wall,
        "tokens": [o.token_ids for o in together],
        "prefix_hits": stats.hits if stats else 0,
        "prefix_queries": stats.queries if stats else 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="qwen35")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--workdir", type=Path, default=Path(".e2e"))
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--suffix-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    device, dtype = bench_device()
    models = widened_zoo(a.workdir, a.family, a.tiny, getattr(torch, dtype))
    spec = drafters(models, a.family)["none"]
    rows = {}
    for cache in (False, True):
        llm = target_llm(
            models,
            a.family,
            spec,
            a.tiny,
            device=device,
            dtype=dtype,
            max_num_seqs=a.requests,
            enable_prefix_caching=cache,
        )
        batch = prompts(
            llm.engine.model_config.vocab_size, a.prefix_tokens, a.requests, a.suffix_tokens
        )
        rows["on" if cache else "off"] = measure(llm, batch, a.max_tokens)
        llm.close()
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    on, off = rows["on"], rows["off"]
    same = on["tokens"] == off["tokens"]
    print(
        f"{a.family}: {a.requests} requests of a {a.prefix_tokens}-token prefix + {a.suffix_tokens} tokens each"
    )
    for name, r in rows.items():
        print(
            f"  prefix caching {name:>3}: TTFT one by one, median {r['ttft_ms_median']:8.2f} ms; all together "
            f"{r['together_s']:7.3f} s; {r['prefix_hits']} of {r['prefix_queries']} prompt tokens from the cache"
        )
    print(
        f"  on / off: TTFT {on['ttft_ms_median'] / off['ttft_ms_median']:.3f}x, together "
        f"{on['together_s'] / off['together_s']:.3f}x; greedy tokens equal: {same}"
    )
    if a.out:
        for r in rows.values():
            del r["tokens"]
        Path(a.out).write_text(
            json.dumps(
                {"device": device, "family": a.family, "tokens_equal": same, **rows}, indent=2
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
