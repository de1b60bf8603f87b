"""The flags of every command that builds an engine (the speculative ones: speculative_args.py), the
model they name, and the engine's keyword arguments they give."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from outpace.cli.speculative_args import add_speculative_args, speculative_config
from outpace.zoo import default_model


def add_engine_args(p: argparse.ArgumentParser, positional_model: bool = False) -> None:
    # `outpace generate MODEL` as well as --model MODEL, as vLLM's `vllm serve MODEL`
    if positional_model:
        p.add_argument("model_arg", nargs="?", metavar="MODEL", help="the same as --model")
    p.add_argument(
        "--model", default=None, help="Hugging Face checkpoint directory (default: the zoo target)"
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (the GPU when there is one, else the CPU), cpu or cuda[:N]",
    )
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "fp8", "fp8_e4m3"],
        help="the target's KV cache (and MLA latent cache): auto = the model's dtype; fp8 (= fp8_e4m3) "
        "stores float8_e4m3fn with per-layer k/v scales from the checkpoint (1.0 when it has none), "
        "half the bytes per token, so twice the blocks",
    )
    p.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV cache blocks (default: sized from memory on a GPU, 512 on the CPU unless "
        "--cpu-memory-utilization is given)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="on a GPU, share of its memory the engine may use in all (weights, activations, CUDA "
        "graphs, KV cache; default 0.9); the KV cache gets what is left",
    )
    p.add_argument(
        "--cpu-memory-utilization",
        type=float,
        default=None,
        help="on the CPU, size the KV cache from this share of the RAM available once the models "
        "are loaded",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse KV blocks of shared prompt prefixes across requests (default: on, except with "
        "recurrent drafts)",
    )
    p.add_argument(
        "--num-state-checkpoints",
        type=int,
        default=None,
        help="hybrid targets with prefix caching: recurrent states kept at block boundaries "
        "(default: max_num_seqs, the running batch's limit: 64, or serve's flag of that name; 0 "
        "turns their prefix caching off)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument(
        "--attention-backend",
        default="auto",
        choices=["auto", "torch", "triton"],
        help="auto: triton on CUDA, torch on the CPU",
    )
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--cuda-graph-sizes",
        type=positive_int,
        nargs="+",
        default=None,
        metavar="N",
        help="the batch sizes whose decode step is captured (default: 1, 2, 4, 8, 16, 32, 48, 64, "
        "96, 128, 192, 256 below max_num_seqs, the running batch's limit, and max_num_seqs: 64, or "
        "serve's flag of that name); larger batches run eagerly (a GPU only: refused on the CPU and "
        "with --enforce-eager)",
    )
    p.add_argument(
        "--no-run-ahead",
        action="store_true",
        help="greedy decode and the captured speculative iteration wait for each step's tokens "
        "before launching the next",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="deterministic mode: batch-invariant projections on CUDA (speculation matches plain "
        "decoding bit for bit in bf16; slower)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="shard the model over N ranks, one process each (started here, or by torchrun "
        "--nproc-per-node N); NCCL between GPUs, gloo between CPU processes",
    )
    ep = p.add_mutually_exclusive_group()
    ep.add_argument(
        "--expert-parallel-size",
        "--ep",
        type=int,
        default=1,
        metavar="N",
        help="place the routed experts whole on N ranks (1; the tensor-parallel size; or any N with "
        "--tensor-parallel-size 1, attention then whole on every rank)",
    )
    ep.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="vLLM's flag: expert parallelism over the tensor-parallel ranks (EP = TP)",
    )
    p.add_argument(
        "--dist-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="with several ranks: how long a collective waits for a rank that hangs before the engine "
        "stops, naming it (default 300)",
    )
    add_generation_config_args(p)
    add_speculative_args(p)


def add_generation_config_args(p: argparse.ArgumentParser) -> None:
    """vLLM's flags for the sampling defaults of requests that leave a field unset (outpace/generation_defaults.py)."""
    p.add_argument(
        "--generation-config",
        default="auto",
        metavar="auto|vllm|DIR",
        help="the sampling defaults of requests that leave a field unset: auto = the model's "
        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens), "
        "vllm = none (outpace's own), DIR = the generation_config.json in DIR",
    )
    p.add_argument(
        "--override-generation-config",
        type=json_object,
        default=None,
        metavar="JSON",
        help="generation config keys set over --generation-config's, e.g. '{\"temperature\": 0.6}'",
    )


def json_object(text: str) -> dict:
    """An argparse type: a JSON object, else the flag's usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be a JSON object")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a count, a size), else the flag's usage error."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be an integer >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0, else the flag's usage error."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be an integer >= 0")
    return value


def resolve_model(a: argparse.Namespace) -> None:
    """a.model from --model or the positional MODEL (not both, unless equal), else the zoo target."""
    given = {m for m in (getattr(a, "model_arg", None), a.model) if m is not None}
    if len(given) > 1:
        sys.exit(f"error: two models given: {a.model_arg} and --model {a.model}")
    if given:
        a.model = given.pop()
        return
    try:
        a.model = str(default_model())
    except FileNotFoundError as e:
        sys.exit(f"error: no model given and {e}")


def check_model_dir(path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        sys.exit(f"error: {path} is not a model directory (no config.json)")


def graph_sizes(a: argparse.Namespace) -> list[int] | None:
    """--cuda-graph-sizes, refused where the device (--device; auto resolved) is the CPU: CUDA graphs are
    captured on a GPU only (with --enforce-eager EngineConfig refuses them)."""
    if a.cuda_graph_sizes is None:
        return None
    from outpace.config import default_device

    device = default_device() if a.device == "auto" else a.device
    if device == "cpu":
        sizes = " ".join(map(str, a.cuda_graph_sizes))
        where = " (the CPU here: torch sees no GPU)" if a.device == "auto" else ""
        raise ValueError(
            f"--cuda-graph-sizes {sizes} does not apply with --device {a.device}{where}: CUDA "
            "graphs are captured on a GPU only; leave --cuda-graph-sizes out"
        )
    return a.cuda_graph_sizes


def expert_parallel_size(a: argparse.Namespace) -> int:
    """--expert-parallel-size, or the tensor-parallel size with --enable-expert-parallel: refused with
    --tensor-parallel-size 1, where it would place every expert on the one rank (vLLM spreads the experts over
    data-parallel ranks too; here each data-parallel replica holds all of them), never ignored."""
    if not a.enable_expert_parallel:
        return a.expert_parallel_size
    if a.tensor_parallel_size == 1:
        raise ValueError(
            "--enable-expert-parallel places the experts over the tensor-parallel ranks, and "
            "--tensor-parallel-size is 1: give --tensor-parallel-size N (EP = TP = N), or "
            "--expert-parallel-size N for N ranks of experts with attention whole on each"
        )
    return a.tensor_parallel_size


def engine_kwargs(a: argparse.Namespace, speculative: bool = True) -> dict:
    """The engine's keyword arguments (LLM, EngineConfig) that the flags of ``add_engine_args`` give."""
    kwargs = dict(
        device=a.device,
        dtype=a.dtype,
        kv_cache_dtype=a.kv_cache_dtype,
        num_kv_blocks=a.num_kv_blocks,
        block_size=a.block_size,
        gpu_memory_utilization=a.gpu_memory_utilization,
        cpu_memory_utilization=a.cpu_memory_utilization,
        enable_prefix_caching=a.enable_prefix_caching,
        num_state_checkpoints=a.num_state_checkpoints,
        max_num_batched_tokens=a.max_num_batched_tokens,
        attention_backend=a.attention_backend,
        cuda_graphs=not a.enforce_eager,
        cuda_graph_sizes=graph_sizes(a),
        run_ahead=not a.no_run_ahead,
        batch_invariant=a.batch_invariant,
        tensor_parallel_size=a.tensor_parallel_size,
        expert_parallel_size=expert_parallel_size(a),
        dist_timeout=a.dist_timeout,
        generation_config=a.generation_config,
        override_generation_config=a.override_generation_config,
    )
    if speculative:
        kwargs["speculative"] = speculative_config(a)
    return kwargs
