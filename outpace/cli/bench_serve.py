"""``outpace bench serve``: load a running server over HTTP, or (--sweep) start a server per method and
load each at several concurrencies."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from outpace.cli.engine_args import check_model_dir, non_negative_int, positive_int
from outpace.zoo import TARGET

# NOTE: the bench modules are imported in the functions that run them: the parser (and `outpace --help`)
# loads no torch.


def add_serve_bench_args(b: argparse.ArgumentParser) -> None:
    sb = b.add_argument_group("bench serve")
    sb.add_argument("--url", default="http://127.0.0.1:30000", help="the server's base URL")
    sb.add_argument("--num-requests", type=positive_int, default=96)
    sb.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=None,
        help="requests in flight at once (default 8; --sweep: the levels, default 1 2 4 8 16 "
        "32 64)",
    )
    sb.add_argument(
        "--prompts",
        default=None,
        help='JSON file: a list of prompts or {"prompts": [...]} (cycled; default: the zoo\'s '
        "held-out prompts)",
    )
    sb.add_argument("--temperature", type=float, default=0.0)
    sb.add_argument("--api-key", default=None)
    sb.add_argument(
        "--served-model", default=None, help="model name to send (default: the server's first)"
    )
    sb.add_argument(
        "--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions"
    )
    ss = b.add_argument_group("bench serve --sweep (outpace/bench/serve_sweep.py)")
    ss.add_argument(
        "--sweep",
        action="store_true",
        help="start `outpace serve` for each of --methods (default: none eagle3) and load it at "
        "each --concurrency with a request mix of shared prefixes; JSON, PNG and server logs "
        "into --out",
    )
    ss.add_argument(
        "--model-dir",
        default=None,
        help="a folder holding tinypy and its drafts, as the zoo does (default: the zoo "
        "widened to 8B in --workdir, written once)",
    )
    ss.add_argument(
        "--min-requests",
        type=positive_int,
        default=None,
        help="requests per level at least (default 16)",
    )
    ss.add_argument(
        "--requests-per-concurrency",
        type=positive_int,
        default=None,
        help="requests per level: this many times its concurrency, if more (default 4)",
    )
    ss.add_argument(
        "--min-tokens",
        type=positive_int,
        default=32,
        help="each request's max_tokens is drawn from --min-tokens to --max-tokens",
    )
    ss.add_argument(
        "--warmup-requests",
        type=non_negative_int,
        default=None,
        help="untimed requests before each method's levels (default 64)",
    )
    ss.add_argument("--seed", type=int, default=None, help="the request mix's seed (default 0)")
    ss.add_argument(
        "--serve-args",
        default="",
        help='more `outpace serve` flags for every server, e.g. "--num-kv-blocks 4096"',
    )


def check_temperature(a: argparse.Namespace) -> None:
    """--temperature as a request's (SamplingParams): a finite number >= 0, else refused by name before any
    request (the server answered every request 400, and --sweep ended plotting no numbers)."""
    if not (math.isfinite(a.temperature) and a.temperature >= 0):
        raise ValueError(f"--temperature {a.temperature} is invalid: must be a finite number >= 0")


def load_server(a: argparse.Namespace) -> None:
    """``bench serve``: load the server at --url."""
    import httpx

    from outpace.server.bench import run_serve_bench

    if a.concurrency and len(a.concurrency) > 1:
        sys.exit("error: bench serve --url runs one concurrency (several need --sweep)")
    check_temperature(a)
    if a.prompts is not None:
        check_prompts(a.prompts)
    try:
        run_serve_bench(
            a.url,
            num_requests=a.num_requests,
            concurrency=(a.concurrency or [8])[0],
            prompts=a.prompts,
            max_tokens=a.max_tokens,
            temperature=a.temperature,
            api_key=a.api_key,
            model=a.served_model,
            chat=a.chat,
            out_json=a.out,
        )
    except httpx.TransportError as e:  # (no server there, or an address httpx cannot reach)
        raise ValueError(f"--url {a.url}: {e or type(e).__name__}") from None


def check_prompts(path: str) -> None:
    """Refuse a --prompts file that holds no prompts, naming the flag and the file, before any request."""
    from outpace.server.bench import load_prompts

    if not Path(path).is_file():
        raise ValueError(f"--prompts {path}: no such file")
    try:
        load_prompts(path)
    except (ValueError, KeyError, TypeError) as e:  # (invalid JSON or UTF-8; another shape)
        raise ValueError(
            f'--prompts {path}: not a JSON list of prompts or {{"prompts": [...]}} '
            f"({type(e).__name__}: {e})"
        ) from None


def serve_flags(text: str) -> tuple[str, ...]:
    """--serve-args split as a shell would, refused (naming it and the first flag or value `outpace serve`
    would refuse) before any server starts rather than in each server's log."""
    import contextlib
    import io

    from outpace.cli import build_parser

    try:
        flags = tuple(shlex.split(text))
    except ValueError as e:  # (an unclosed quote)
        raise ValueError(f"--serve-args {text!r}: {e}") from None
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            build_parser().parse_args(["serve", "--model", TARGET, *flags])
    except SystemExit:
        problem = usage.getvalue().strip().splitlines()[-1:] or ["not flags of outpace serve"]
        raise ValueError(f"--serve-args {text!r}: {problem[0]}") from None
    return flags


def sweep_servers(a: argparse.Namespace) -> None:
    """``bench serve --sweep``: start a server per method and load each at every concurrency."""
    from outpace.bench.serve_sweep import NothingServed, SweepConfig, run_serve_sweep

    if a.min_tokens > a.max_tokens:
        raise ValueError(f"--min-tokens {a.min_tokens} is more than --max-tokens {a.max_tokens}")
    check_temperature(a)
    if not (a.device in ("auto", "cpu") or a.device.startswith("cuda")):  # (as EngineConfig's)
        raise ValueError(f"--device {a.device!r} is invalid: must be auto, cpu or cuda[:N]")
    serve_args = serve_flags(a.serve_args)
    model_dir = Path(a.model_dir or a.workdir)
    if a.model_dir is None:
        from outpace.bench.e2e import widened_zoo

        widened_zoo(model_dir)
    check_model_dir(str(model_dir / TARGET))
    given = dict(
        methods=a.methods and tuple(a.methods),
        concurrency=a.concurrency and tuple(a.concurrency),
        min_requests=a.min_requests,
        requests_per_concurrency=a.requests_per_concurrency,
        max_tokens=(a.min_tokens, a.max_tokens),
        warmup_requests=a.warmup_requests,
        temperature=a.temperature,
        seed=a.seed,
        device=a.device,
        dtype=a.dtype,
        serve_args=serve_args,
        chat=a.chat,
    )
    # a field left None takes the sweep's default
    config = SweepConfig(**{k: v for k, v in given.items() if v is not None})
    try:
        run_serve_sweep(model_dir, Path(a.out or "benchmarks"), config)
    except RuntimeError as e:
        # (a server that refused its flags: bench/local_server.py ``check_alive``; or its every request)
        if not (isinstance(e, NothingServed) or str(e).startswith("the server exited")):
            raise
        raise ValueError(f"bench serve --sweep: {e}") from None
