"""``outpace bench``: decode speed, acceptance, a running server, the GPU and multi-GPU suites."""

from __future__ import annotations

import argparse
from pathlib import Path

from outpace.cli.bench_serve import add_serve_bench_args, load_server, sweep_servers
from outpace.cli.engine_args import (
    add_engine_args,
    check_model_dir,
    engine_kwargs,
    non_negative_int,
    positive_int,
)
from outpace.cli.speculative_args import add_speculative_args, speculative_config
from outpace.zoo import zoo_dir

# NOTE: each bench module is imported in the function that runs it: the parser (and `outpace --help`)
# loads no torch.

MODEL_FREE = ("serve", "gpu", "e2e", "multi")  # the benches that load no --model


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="decode throughput with and without speculation; acceptance; or a server"
    )
    add_bench_args(b)
    b.set_defaults(func=run)


def add_bench_args(b: argparse.ArgumentParser) -> None:
    b.add_argument(
        "what",
        nargs="?",
        default="speed",
        choices=["speed", "acceptance", "gpu", "serve", "cpu", "e2e", "multi"],
        help="speed: tokens/s at each batch size; acceptance: every zoo drafter on held-out "
        "prompts; serve: load a running server (outpace serve) over HTTP; cpu: plain decode "
        "against transformers' generate on the CPU; e2e: every drafter on the zoo widened to "
        "8B (GPU); multi: tensor and data parallelism on the GPUs of one machine",
    )
    add_engine_args(b)
    b.add_argument(
        "--batch-sizes",
        type=positive_int,
        nargs="+",
        default=None,
        help="bench speed (default: 1 8) and e2e (default: 1 8 32): the batches timed",
    )
    b.add_argument("--max-tokens", type=positive_int, default=64)
    b.add_argument(
        "--out",
        default=None,
        help="also write the rows as JSON here (bench gpu: the output folder)",
    )
    b.add_argument(
        "--parts",
        default=None,
        help="bench gpu: which parts to run (see outpace/bench/gpu.py; default abef; s: the "
        "seed families at their public shapes, outpace/bench/families.py); bench "
        "multi: of correctness,tp_speed,dp,dp_eagle3 (all by default) or single "
        "(outpace/bench/multi_gpu.py)",
    )
    b.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help="bench e2e and serve --sweep: the methods to run (of bench/e2e.py drafters(); "
        "default: all, and none eagle3 for serve --sweep)",
    )
    b.add_argument(
        "--workdir",
        default=".e2e_models",
        help="bench e2e, multi and serve --sweep: where the widened 8B-shaped zoo (and bench "
        "multi's random checkpoints) are written",
    )
    b.add_argument(
        "--family",
        default="llama",
        choices=["llama", "deepseek", "qwen35", "gemma"],
        help="bench e2e: which zoo target to widen (llama: tinypy into Llama-3.1-8B; deepseek, "
        "qwen35, gemma: bench/widen_deepseek.py, widen_hybrid.py, widen_gemma.py)",
    )
    b.add_argument(
        "--tiny",
        action="store_true",
        help="bench e2e: the tiny test widening, batches 1 and 2 (CPU float32 without a GPU)",
    )
    gb = b.add_argument_group("bench gpu")
    gb.add_argument(
        "--shapes",
        default=None,
        help="part s: comma-separated family shapes (outpace/bench/family_shapes.py; all by default)",
    )
    mb = b.add_argument_group("bench multi")
    mb.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="bench multi: seconds the whole run may take (540 by default); items that no longer "
        "fit are listed as not run, and the same command into the same --out continues with them. "
        "bench gpu: seconds part s's shapes may take (no limit by default); those that no longer fit "
        "are listed as not run",
    )
    mb.add_argument(
        "--no-oracle",
        action="store_true",
        help="bench multi: leave out the seed models' MTP items under ORACLE acceptance (qwen3next80b, ep, "
        "step35flash: plain decode only)",
    )
    mb.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="bench multi: the ranks of the rank-group parts, one GPU each (2 by default): TP = N, "
        "and the ep part's EP = TP = N",
    )
    mb.add_argument(
        "--dp-reserve",
        type=float,
        default=None,
        help="seconds of the limit kept for each data-parallel part (260)",
    )
    mb.add_argument(
        "--dp-streams",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="the data-parallel parts' levels of concurrent streams: the first (64 by "
        "default), and optionally a second, saturated one (256 by default; one value: that "
        "level alone)",
    )
    cb = b.add_argument_group("bench cpu")
    cb.add_argument(
        "--busy",
        type=non_negative_int,
        nargs="+",
        default=[0],
        help="one measurement per value, beside that many spinning processes (e.g. --busy 0 1)",
    )
    cb.add_argument(
        "--rounds", type=positive_int, default=5, help="interleaved rounds; the median is reported"
    )
    cb.add_argument(
        "--num-prompts",
        type=positive_int,
        default=4,
        help="prompts of zoo/eval_prompts.json per round",
    )
    add_serve_bench_args(b)


def _dests(add_args) -> set[str]:
    """The flags (their argparse names) that ``add_args`` adds to a parser."""
    p = argparse.ArgumentParser(add_help=False)
    add_args(p)
    return set(vars(p.parse_args([])))


_SPECULATIVE = _dests(add_speculative_args)
_ENGINE = _dests(add_engine_args) - _SPECULATIVE  # --model and the engine's flags
_SERVE = {
    "sweep",
    "url",
    "num_requests",
    "concurrency",
    "prompts",
    "max_tokens",
    "temperature",
    "chat",
}
# The flags each bench reads besides --out (and ``what``, every bench's): another
# bench's flag given to it is refused by name rather than ignored (bench cpu runs on the CPU: no --device).
READS = {
    "speed": {*_ENGINE, *_SPECULATIVE, "batch_sizes", "max_tokens"},
    "acceptance": {*_ENGINE, "max_tokens"},  # (every zoo drafter: no speculative flags)
    "cpu": {*_ENGINE - {"device"}, "max_tokens", "busy", "rounds", "num_prompts"},
    "gpu": {"parts", "shapes", "time_limit"},
    "multi": {"parts", "time_limit", "no_oracle", "gpus", "dp_reserve", "dp_streams", "workdir"},
    "e2e": {"workdir", "methods", "max_tokens", "family", "tiny", "batch_sizes"},
    "serve": {*_SERVE, "api_key", "served_model"},
    "serve --sweep": {
        *_SERVE - {"url", "num_requests", "prompts"},
        *("model_dir", "workdir", "methods", "min_requests", "requests_per_concurrency"),
        *("min_tokens", "warmup_requests", "seed", "device", "dtype", "serve_args"),
    },
}


def check_flags_read(a: argparse.Namespace) -> None:
    """Refuse the flags given (other than their defaults) that the bench run does not read, naming each and
    the benches that do read it."""
    p = argparse.ArgumentParser(add_help=False)
    add_bench_args(p)
    bench = "serve --sweep" if a.what == "serve" and a.sweep else a.what
    unread = [
        name
        for name, default in vars(p.parse_args([])).items()
        if name not in READS[bench] | {"what", "out"} and getattr(a, name) != default
    ]
    refusals = []
    for name in unread:
        *others, last = (b for b, reads in READS.items() if name in reads)
        readers = f"{', '.join(others)} and {last}" if others else last
        refusals.append(f"--{name.replace('_', '-')} applies to bench {readers}, not bench {bench}")
    if refusals:
        raise ValueError("; ".join(refusals))


def check_seconds(a: argparse.Namespace) -> None:
    """--time-limit a finite number of seconds > 0 and --dp-reserve one >= 0, else refused by name (bench multi
    took 0 for "not given")."""
    import math

    if a.time_limit is not None and not (math.isfinite(a.time_limit) and a.time_limit > 0):
        raise ValueError(
            f"--time-limit {a.time_limit} is invalid: must be a finite number of seconds > 0"
        )
    if a.dp_reserve is not None and not (math.isfinite(a.dp_reserve) and a.dp_reserve >= 0):
        raise ValueError(
            f"--dp-reserve {a.dp_reserve} is invalid: must be a finite number of seconds >= 0"
        )


def run(a: argparse.Namespace) -> None:
    check_flags_read(a)
    check_seconds(a)
    if a.what == "serve" and a.sweep:
        sweep_servers(a)
        return
    if a.what == "serve":
        load_server(a)
        return
    if a.what == "gpu":
        import torch

        from outpace.bench.gpu import run_gpu_bench

        if not torch.cuda.is_available():
            raise ValueError(
                f"bench gpu runs on a GPU, and torch {torch.__version__} sees none here (bench cpu, "
                "speed and acceptance run on the CPU)"
            )

        shapes = a.shapes.split(",") if a.shapes else None
        run_gpu_bench(
            Path(a.out or "benchmarks"),
            parts=a.parts or "abef",
            shapes=shapes,
            time_limit_s=a.time_limit,
        )
        return
    if a.what == "multi":
        from outpace.bench.multi_gpu import PARTS, run_multi_gpu_bench

        parts = a.parts or ",".join(PARTS)
        run_multi_gpu_bench(
            Path(a.out or "benchmarks"), parts=parts, plan=multi_plan(a), workdir=Path(a.workdir)
        )
        return
    if a.what == "e2e":
        from outpace.bench.e2e import run_e2e_bench

        run_e2e_bench(
            Path(a.out or "benchmarks"),
            Path(a.workdir),
            a.methods,
            max_tokens=a.max_tokens,
            family=a.family,
            tiny=a.tiny,
            batches=a.batch_sizes,
        )
        return
    check_model_dir(a.model)
    if a.what == "acceptance":
        from outpace.bench.acceptance import run_acceptance_bench

        kwargs = engine_kwargs(a, speculative=False)
        run_acceptance_bench(a.model, zoo_dir(), Path(a.out or "benchmarks"), a.max_tokens, kwargs)
        return
    if a.what == "cpu":
        from outpace.bench.cpu_vs_transformers import run_cpu_bench

        run_cpu_bench(
            a.model,
            max_tokens=a.max_tokens,
            num_prompts=a.num_prompts,
            rounds=a.rounds,
            busy=a.busy,
            engine_kwargs=engine_kwargs(a, speculative=False),
            out_json=a.out,
        )
        return
    from outpace.bench.decode import run_decode_bench

    run_decode_bench(
        a.model,
        batch_sizes=a.batch_sizes or [1, 8],
        max_tokens=a.max_tokens,
        engine_kwargs=engine_kwargs(a, speculative=False),
        speculative=speculative_config(a),
        out_json=a.out,
    )


def multi_plan(a: argparse.Namespace):
    """``bench multi``'s Plan: its defaults, with the budget and data-parallel levels the command line gives."""
    from outpace.bench.multi_gpu_plan import Plan

    fields = {
        k: v
        for k, v in (
            ("time_limit_s", a.time_limit),
            ("dp_reserve_s", a.dp_reserve),
            ("world", a.gpus),
        )
        if v is not None
    }
    if a.no_oracle:
        fields["seed_oracle"] = False
    if a.gpus is not None and a.gpus < 2:
        raise ValueError(
            f"--gpus {a.gpus} is invalid: bench multi runs on 2 or more GPUs ('single' for one)"
        )
    if a.dp_streams:
        if len(a.dp_streams) > 2 or min(a.dp_streams) < 1:
            raise ValueError(
                f"--dp-streams {' '.join(map(str, a.dp_streams))} is invalid: one or two levels of "
                "concurrent streams, each >= 1"
            )
        saturated = a.dp_streams[1] if len(a.dp_streams) > 1 else None
        fields.update(dp_streams=a.dp_streams[0], dp_saturated_streams=saturated)
    return Plan(**fields)
