"""The engine's host time per row and step: a one-layer, hidden-32 random Llama on the CPU, where the forward costs
next to nothing, decoding N greedy requests of 64 tokens (after a 32-token prompt) through ``LLMEngine.step``.

    PYTHONPATH=. python benchmarks/scripts/diag_host_cost.py --rows 256 [--stream] [--profile]

``--stream``: the engine returns every request's text so far each step (``stream_outputs``, as the server runs
it), which adds the incremental detokenization; ``--profile``: the outpace functions by cumulative time.
2026-11-27, this container's CPU, 256 rows streamed, two interleaved runs each: 19.8 and 20.0 us with the
detokenizer of 73496ed (two ``tokenizer.decode`` calls a step), 18.0 and 16.2 with ``DecodeStream``.
2026-11-28, same CPU, interleaved runs, ad6e2ac -> cfb8f78 (per-row work hoisted, results by column, fewer
objects per row and step): 256 rows median of 8, 14.8 -> 10.3 us; 1024 rows median of 5, 17.0 -> 10.5 us;
256 rows streamed, three runs each, 16.6-18.2 -> 12.3-13.3 us. About 6.5 us of the 256-row figure is the decode
iteration's tensor work on the CPU (forward, logits, verify), which the host code does not change.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from outpace.bench.random_checkpoint import random_target  # noqa: E402
from outpace.config import EngineConfig  # noqa: E402
from outpace.engine.engine import LLMEngine  # noqa: E402
from outpace.sampling_params import SamplingParams  # noqa: E402

TINY = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    eos_token_id=0,
)


def decode_all(engine: LLMEngine, rows: int, tokens: int) -> tuple[int, float]:
    """Submit ``rows`` requests and step until all finish: (steps, seconds)."""
    for i in range(rows):
        prompt = [1 + (i + j) % 500 for j in range(32)]
        engine.submit(
            engine.new_request(
                prompt,
                SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                f"r{time.perf_counter()}-{i}",
            )
        )
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests:
        engine.step()
        steps += 1
    return steps, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        random_target(tmp, TINY, dtype=torch.float32)
        engine = LLMEngine(
            EngineConfig(
                model=tmp,
                device="cpu",
                max_num_seqs=a.rows,
                num_kv_blocks=a.rows * 8 + 64,
                max_num_batched_tokens=a.rows * 40,
            ),
            progress=False,
        )
        engine.stream_outputs = a.stream
        decode_all(engine, a.rows, 4)  # warm-up
        steps, seconds = decode_all(engine, a.rows, 64)
        print(
            f"rows {a.rows}, stream {a.stream}: {1e3 * seconds / steps:.2f} ms a step, "
            f"{1e6 * seconds / steps / a.rows:.1f} us per row and step"
        )
        if a.profile:
            profile = cProfile.Profile()
            profile.enable()
            decode_all(engine, a.rows, 64)
            profile.disable()
            pstats.Stats(profile).sort_stats("cumtime").print_stats("outpace", 30)


if __name__ == "__main__":
    main()
