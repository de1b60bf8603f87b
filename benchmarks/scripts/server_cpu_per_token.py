"""The server process's CPU time per streamed output token: ``outpace serve`` on the CPU with a one-layer random
model (hidden 32, the zoo tokenizer), so that the HTTP side, the engine thread's host work and detokenization,
not the model, are what the process spends its time on; ``--streams`` levels of greedy 64-token streams.

    python benchmarks/scripts/server_cpu_per_token.py --out benchmarks/results/server_cpu --tag NAME [--streams 64 256]

Writes ``server_cpu_NAME.json``: per level the output tokens/s, the server's CPU seconds (user + system, from
/proc) per output token, and the median time per output token; and whether uvicorn found uvloop and
httptools (it uses them when installed: its ``auto`` loop and HTTP implementation). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from outpace.bench.local_server import LocalServer
from outpace.bench.random_checkpoint import random_target
from outpace.server.bench import cycled, load_prompts, run_load
from outpace.zoo import zoo_dir

TINY = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=4096,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    eos_token_id=0,
)


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def measure(model: Path, streams: int, prompts: list[str], serve_args: list[str]) -> dict:
    server = LocalServer(
        str(model),
        "--device",
        "cpu",
        "--method",
        "none",
        "--max-num-seqs",
        str(streams),
        "--num-kv-blocks",
        "4096",
        "--max-num-batched-tokens",
        "8192",
        "--log-level",
        "warning",
        *serve_args,
    )
    try:
        server.wait_ready(120)
        run_load(server.url, cycled(prompts, streams, 8), streams, ignore_eos=True)  # warm-up
        before = process_cpu_seconds(server.proc.pid)
        row = run_load(server.url, cycled(prompts, 2 * streams, 64), streams, ignore_eos=True)
        cpu = process_cpu_seconds(server.proc.pid) - before
    finally:
        server.close()
    return {
        "streams": streams,
        "output_tokens": row["output_tokens"],
        "num_failed": row["num_failed"],
        "output_tokens_per_s": row["output_tokens_per_s"],
        "server_cpu_s": cpu,
        "server_cpu_us_per_token": 1e6 * cpu / row["output_tokens"],
        "tpot_p50_s": row["tpot_s"]["p50"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    p.add_argument(
        "--serve-args", default="", help="more `outpace serve` arguments, e.g. '--engine-process'"
    )
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="outpace-server-cpu-"))
    try:
        model = work / "tiny"
        random_target(model, TINY, dtype=torch.float32)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(zoo_dir() / "tinypy" / name, model / name)
        prompts = load_prompts(zoo_dir() / "eval_prompts.json")
        rows = [measure(model, s, prompts, a.serve_args.split()) for s in a.streams]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "tag": a.tag,
        "uvloop": importlib.util.find_spec("uvloop") is not None,
        "httptools": importlib.util.find_spec("httptools") is not None,
        "serve_args": a.serve_args,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"server_cpu_{a.tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(
            f"{a.tag}: {r['streams']} streams, {r['output_tokens_per_s']:.0f} output tokens/s, server CPU "
            f"{r['server_cpu_us_per_token']:.0f} us per token, TPOT p50 {1000 * r['tpot_p50_s']:.1f} ms"
        )


if __name__ == "__main__":
    main()
