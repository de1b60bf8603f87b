"""Command line: ``outpace generate | serve | bench | train``. The CLI only builds configs and calls the API."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from outpace.registry import PROPOSERS
from outpace.zoo import default_draft, default_model, zoo_dir

METHODS = ["none", *PROPOSERS]  # the drafters are the registry's


def _engine_args(p: argparse.ArgumentParser, positional_model: bool = False) -> None:
    if positional_model:  # `outpace generate MODEL` as well as --model MODEL, as vLLM's `vllm serve MODEL`
        p.add_argument("model_arg", nargs="?", metavar="MODEL", help="the same as --model")
    p.add_argument("--model", default=None, help="Hugging Face checkpoint directory (default: the zoo target)")
    p.add_argument("--device", default="auto", help="auto (the GPU when there is one, else the CPU), cpu or cuda[:N]")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV cache blocks (default: sized from memory on a GPU, 512 on the CPU unless "
                        "--cpu-memory-utilization is given)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of the GPU's memory the engine may use in all (weights, activations, CUDA graphs, "
                        "KV cache); the KV cache gets what is left")
    p.add_argument("--cpu-memory-utilization", type=float, default=None,
                   help="on the CPU, size the KV cache from this share of the RAM available once the models "
                        "are loaded")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV blocks of shared prompt prefixes across requests (default: on, except for "
                        "hybrid targets and recurrent drafts)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"],
                   help="auto: triton on CUDA, torch on the CPU")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="the batch sizes whose decode step is captured (default: 1, 2, 4, 8, 16, 32, 48, 64, 96, "
                        "128, 192, 256 below --max-num-seqs, and --max-num-seqs); larger batches run eagerly")
    p.add_argument("--no-run-ahead", action="store_true",
                   help="greedy decode and the captured speculative iteration wait for each step's tokens "
                        "before launching the next")
    p.add_argument("--batch-invariant", action="store_true",
                   help="deterministic mode: batch-invariant projections on CUDA (speculation matches plain "
                        "decoding bit for bit in bf16; slower)")
    p.add_argument("--tensor-parallel-size", "--tp", type=int, default=1, metavar="N",
                   help="shard the model over N ranks, one process each (started here, or by torchrun "
                        "--nproc-per-node N); NCCL between GPUs, gloo between CPU processes")
    p.add_argument("--method", default=None, choices=METHODS,
                   help="drafter (default: eagle3 with the zoo draft on the zoo target, none otherwise)")
    p.add_argument("--draft", default=None, help="draft checkpoint directory")
    p.add_argument("--num-steps", type=int, default=None,
                   help="draft steps per verify (default 5; a DFlash draft's block size - 1)")
    p.add_argument("--topk", type=int, default=1, help="branches per draft step (1: a chain)")
    p.add_argument("--num-draft-tokens", type=int, default=None,
                   help="tokens verified per step (default: num-steps + 1 for a chain, 16 at most for a tree)")


def _is_zoo_target(model: str) -> bool:
    try:
        return Path(model).resolve() == default_model().resolve()
    except FileNotFoundError:
        return False


def _resolve_model(a: argparse.Namespace) -> None:
    """a.model from --model or the positional MODEL (not both, unless equal), else the zoo target."""
    given = {m for m in (getattr(a, "model_arg", None), a.model) if m is not None}
    if len(given) > 1:
        sys.exit(f"error: two models given: {getattr(a, 'model_arg')} and --model {a.model}")
    if given:
        a.model = given.pop()
        return
    try:
        a.model = str(default_model())
    except FileNotFoundError as e:
        sys.exit(f"error: no model given and {e}")


def _speculative_config(a: argparse.Namespace):
    from outpace.config import SpeculativeConfig

    zoo_target = _is_zoo_target(a.model)
    method = a.method or ("eagle3" if zoo_target else "none")
    if method == "none":
        return SpeculativeConfig()
    draft = a.draft
    if draft is None and zoo_target and default_draft(method) is not None:
        draft = str(default_draft(method))
    num_steps = a.num_steps
    fixed = num_steps is not None or a.num_draft_tokens is not None
    if num_steps is None:
        if method == "dflash" and draft:
            from outpace.models.drafts.dflash import dflash_block_size

            num_steps = dflash_block_size(draft) - 1
        elif method == "mtp" and _mtp_layers(a.model) > 1:  # chained layers: one step each
            num_steps = _mtp_layers(a.model)
        else:
            num_steps = 5
    # --num-steps / --num-draft-tokens fix the shape; without them each step chooses up to this one
    return SpeculativeConfig(method, draft, num_steps=num_steps, topk=a.topk, num_draft_tokens=a.num_draft_tokens,
                             adaptive=not fixed)


def _mtp_layers(model: str) -> int:
    """The MTP layers a target's config.json declares (0 without one)."""
    path = Path(model) / "config.json"
    return int(json.loads(path.read_text()).get("num_nextn_predict_layers", 0)) if path.is_file() else 0


def _engine_kwargs(a: argparse.Namespace, speculative: bool = True) -> dict:
    kwargs = dict(device=a.device, dtype=a.dtype, num_kv_blocks=a.num_kv_blocks, block_size=a.block_size,
                  gpu_memory_utilization=a.gpu_memory_utilization, cpu_memory_utilization=a.cpu_memory_utilization,
                  enable_prefix_caching=a.enable_prefix_caching,
                  max_num_batched_tokens=a.max_num_batched_tokens, attention_backend=a.attention_backend,
                  cuda_graphs=not a.enforce_eager, cuda_graph_sizes=a.cuda_graph_sizes, run_ahead=not a.no_run_ahead,
                  batch_invariant=a.batch_invariant, tensor_parallel_size=a.tensor_parallel_size)
    if speculative:
        kwargs["speculative"] = _speculative_config(a)
    return kwargs


def _check_model_dir(path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        sys.exit(f"error: {path} is not a model directory (no config.json)")


def cmd_generate(a: argparse.Namespace) -> None:
    from outpace import LLM, SamplingParams

    _check_model_dir(a.model)
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, min_p=a.min_p,
                            max_tokens=a.max_tokens, seed=a.seed, ignore_eos=a.ignore_eos)
    llm = LLM(a.model, **_engine_kwargs(a))
    prompt = a.prompt if a.prompt is not None else a.prompt_token_ids
    out = llm.generate([prompt], params)[0]
    spec = out.spec_metrics
    if a.json:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "tokens_per_s": out.tokens_per_s, "speculative": spec.to_dict()}))
    elif a.prompt is None:  # token ids in, token ids out (--json gives the text too)
        print(" ".join(map(str, out.token_ids)))
    else:
        print(a.prompt + out.text)
        line = f"\n[{len(out.token_ids)} tokens, {out.finish_reason}, {out.tokens_per_s:.1f} tokens/s"
        if spec.num_verifies:
            rates = " ".join(f"{r:.2f}" for r in spec.acceptance_rate_per_position)
            line += f", {spec.num_verifies} verifies, tau {spec.acceptance_length:.2f}, per-position {rates}"
        print(line + "]", file=sys.stderr)


def cmd_serve(a: argparse.Namespace) -> None:
    import os

    from outpace.config import EngineConfig
    from outpace.server.app import run_server

    _check_model_dir(a.model)
    config = EngineConfig(model=a.model, max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len,
                          **_engine_kwargs(a))
    run_server(config, host=a.host, port=a.port, log_level=a.log_level, served_model_name=a.served_model_name,
               api_key=a.api_key or os.environ.get("OUTPACE_API_KEY") or None,
               max_queued_requests=a.max_queued_requests, max_tokens_limit=a.max_tokens_limit, max_n=a.max_n,
               max_body_bytes=a.max_body_bytes, log_interval=a.log_interval, drain_timeout=a.drain_timeout,
               data_parallel_size=a.data_parallel_size, engine_process=a.engine_process)


def cmd_bench(a: argparse.Namespace) -> None:
    if a.what == "serve" and a.sweep:
        cmd_serve_sweep(a)
        return
    if a.what == "serve":
        from outpace.server.bench import run_serve_bench

        if a.concurrency and len(a.concurrency) > 1:
            sys.exit("error: bench serve --url runs one concurrency (several need --sweep)")
        run_serve_bench(a.url, num_requests=a.num_requests, concurrency=(a.concurrency or [8])[0],
                        prompts=a.prompts, max_tokens=a.max_tokens, temperature=a.temperature, api_key=a.api_key,
                        model=a.served_model, chat=a.chat, out_json=a.out)
        return
    if a.what == "gpu":
        from outpace.bench.gpu import run_gpu_bench

        run_gpu_bench(Path(a.out or "benchmarks"), parts=a.parts or "abef")
        return
    if a.what == "multi":
        from outpace.bench.multi_gpu import PARTS, run_multi_gpu_bench

        run_multi_gpu_bench(Path(a.out or "benchmarks"), parts=a.parts or ",".join(PARTS), plan=multi_plan(a),
                            workdir=Path(a.workdir))
        return
    if a.what == "e2e":
        from outpace.bench.e2e import run_e2e_bench

        run_e2e_bench(Path(a.out or "benchmarks"), Path(a.workdir), a.methods, max_tokens=a.max_tokens)
        return
    from outpace.bench.decode import run_decode_bench

    _check_model_dir(a.model)
    if a.what == "acceptance":
        from outpace.bench.acceptance import run_acceptance_bench

        run_acceptance_bench(a.model, zoo_dir(), Path(a.out or "benchmarks"), a.max_tokens,
                             _engine_kwargs(a, speculative=False))
        return
    if a.what == "cpu":
        from outpace.bench.cpu_vs_transformers import run_cpu_bench

        run_cpu_bench(a.model, max_tokens=a.max_tokens, num_prompts=a.num_prompts, rounds=a.rounds, busy=a.busy,
                      engine_kwargs=_engine_kwargs(a, speculative=False), out_json=a.out)
        return
    run_decode_bench(a.model, batch_sizes=a.batch_sizes, max_tokens=a.max_tokens,
                     engine_kwargs=_engine_kwargs(a, speculative=False), speculative=_speculative_config(a),
                     out_json=a.out)


def multi_plan(a: argparse.Namespace):
    """``bench multi``'s Plan: its defaults, with the budget and data-parallel levels the command line gives."""
    from outpace.bench.multi_gpu import Plan

    fields = {k: v for k, v in (("time_limit_s", a.time_limit), ("dp_reserve_s", a.dp_reserve)) if v}
    if a.dp_streams:
        if len(a.dp_streams) > 2 or min(a.dp_streams) < 1:
            raise ValueError(f"--dp-streams {' '.join(map(str, a.dp_streams))} is invalid: one or two levels of "
                             "concurrent streams, each >= 1")
        fields.update(dp_streams=a.dp_streams[0], dp_saturated_streams=a.dp_streams[1] if len(a.dp_streams) > 1
                      else None)
    return Plan(**fields)


def cmd_serve_sweep(a: argparse.Namespace) -> None:
    import shlex

    from outpace.bench.serve_sweep import SweepConfig, run_serve_sweep

    model_dir = Path(a.model_dir or a.workdir)
    if a.model_dir is None:
        from outpace.bench.e2e import widened_zoo

        widened_zoo(model_dir)
    _check_model_dir(str(model_dir / "tinypy"))
    given = dict(methods=a.methods and tuple(a.methods), concurrency=a.concurrency and tuple(a.concurrency),
                 min_requests=a.min_requests, requests_per_concurrency=a.requests_per_concurrency,
                 max_tokens=(a.min_tokens, a.max_tokens), warmup_requests=a.warmup_requests,
                 temperature=a.temperature, seed=a.seed, device=a.device, dtype=a.dtype,
                 serve_args=tuple(shlex.split(a.serve_args)), chat=a.chat)
    run_serve_sweep(model_dir, Path(a.out or "benchmarks"),
                    SweepConfig(**{k: v for k, v in given.items() if v is not None}))  # None: the sweep's default


def build_parser() -> argparse.ArgumentParser:
    from outpace import __version__

    parser = argparse.ArgumentParser(prog="outpace", description=__doc__)
    parser.add_argument("--version", action="version", version=f"outpace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt")
    _engine_args(g, positional_model=True)
    prompt = g.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt's text")
    prompt.add_argument("--prompt-token-ids", type=int, nargs="+", metavar="ID",
                        help="the prompt as token ids (models without a tokenizer); prints token ids")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (see README: Serve)")
    _engine_args(s, positional_model=True)
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set OUTPACE_API_KEY)")
    s.add_argument("--served-model-name", default=None, help="the model's name in the API (default: its directory name)")
    s.add_argument("--max-num-seqs", type=int, default=64, help="requests in the running batch at most")
    s.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    s.add_argument("--max-queued-requests", type=int, default=512,
                   help="waiting requests at most; more are answered 429")
    s.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens a request may ask for")
    s.add_argument("--max-n", type=int, default=16, help="largest n (choices per prompt)")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies are answered 413")
    s.add_argument("--log-interval", type=float, default=10.0, help="seconds between throughput/tau log lines")
    s.add_argument("--drain-timeout", type=int, default=None,
                   help="on SIGTERM, seconds to wait for in-flight requests (default: until they finish)")
    s.add_argument("--data-parallel-size", "--dp", type=int, default=1, metavar="M",
                   help="engine replicas behind the server, each in its own process (and each tensor-parallel "
                        "over --tensor-parallel-size ranks); requests go to the one with the shortest queue")
    s.add_argument("--engine-process", action="store_true",
                   help="run the one engine in a process of its own, as each data-parallel replica runs, so that "
                        "HTTP streaming and the engine's host work do not share one interpreter (implied by "
                        "--data-parallel-size > 1)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="decode throughput with and without speculation; acceptance; or a server")
    b.add_argument("what", nargs="?", default="speed",
                   choices=["speed", "acceptance", "gpu", "serve", "cpu", "e2e", "multi"],
                   help="speed: tokens/s at each batch size; acceptance: every zoo drafter on held-out prompts; "
                        "serve: load a running server (outpace serve) over HTTP; cpu: plain decode against "
                        "transformers' generate on the CPU; e2e: every drafter on the zoo widened to 8B (GPU); "
                        "multi: tensor and data parallelism on the GPUs of one machine")
    _engine_args(b)
    b.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    b.add_argument("--max-tokens", type=int, default=64)
    b.add_argument("--out", default=None, help="also write the rows as JSON here (bench gpu: the output folder)")
    b.add_argument("--parts", default=None, help="bench gpu: which parts to run (see outpace/bench/gpu.py; default "
                   "abef); bench multi: of correctness,tp_speed,dp,dp_eagle3 (all by default) or single "
                   "(outpace/bench/multi_gpu.py)")
    b.add_argument("--methods", nargs="*", default=None, help="bench e2e and serve --sweep: the methods to run "
                   "(of bench/e2e.py drafters(); default: all, and none eagle3 for serve --sweep)")
    b.add_argument("--workdir", default=".e2e_models", help="bench e2e, multi and serve --sweep: where the widened "
                   "8B-shaped zoo (and bench multi's random checkpoints) are written")
    mb = b.add_argument_group("bench multi")
    mb.add_argument("--time-limit", type=float, default=None, help="seconds the whole run may take (540 by default); "
                    "items that no longer fit are listed as not run, and the same command into the same --out "
                    "continues with them")
    mb.add_argument("--dp-reserve", type=float, default=None,
                    help="seconds of the limit kept for each data-parallel part (260)")
    mb.add_argument("--dp-streams", type=int, nargs="+", default=None, metavar="N",
                    help="the data-parallel parts' levels of concurrent streams: the first (64 by default), and "
                    "optionally a second, saturated one (256 by default; one value: that level alone)")
    cb = b.add_argument_group("bench cpu")
    cb.add_argument("--busy", type=int, nargs="+", default=[0],
                    help="one measurement per value, beside that many spinning processes (e.g. --busy 0 1)")
    cb.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported")
    cb.add_argument("--num-prompts", type=int, default=4, help="prompts of zoo/eval_prompts.json per round")
    sb = b.add_argument_group("bench serve")
    sb.add_argument("--url", default="http://127.0.0.1:30000", help="the server's base URL")
    sb.add_argument("--num-requests", type=int, default=96)
    sb.add_argument("--concurrency", type=int, nargs="+", default=None,
                    help="requests in flight at once (default 8; --sweep: the levels, default 1 2 4 8 16 32 64)")
    sb.add_argument("--prompts", default=None,
                    help="JSON file: a list of prompts or {\"prompts\": [...]} (cycled; default: the zoo's held-out prompts)")
    sb.add_argument("--temperature", type=float, default=0.0)
    sb.add_argument("--api-key", default=None)
    sb.add_argument("--served-model", default=None, help="model name to send (default: the server's first)")
    sb.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    ss = b.add_argument_group("bench serve --sweep (outpace/bench/serve_sweep.py)")
    ss.add_argument("--sweep", action="store_true",
                    help="start `outpace serve` for each of --methods (default: none eagle3) and load it at each "
                         "--concurrency with a request mix of shared prefixes; JSON, PNG and server logs into --out")
    ss.add_argument("--model-dir", default=None,
                    help="a folder holding tinypy and its drafts, as the zoo does (default: the zoo widened to 8B "
                         "in --workdir, written once)")
    ss.add_argument("--min-requests", type=int, default=None, help="requests per level at least (default 16)")
    ss.add_argument("--requests-per-concurrency", type=int, default=None,
                    help="requests per level: this many times its concurrency, if more (default 4)")
    ss.add_argument("--min-tokens", type=int, default=32,
                    help="each request's max_tokens is drawn from --min-tokens to --max-tokens")
    ss.add_argument("--warmup-requests", type=int, default=None,
                    help="untimed requests before each method's levels (default 64)")
    ss.add_argument("--seed", type=int, default=None, help="the request mix's seed (default 0)")
    ss.add_argument("--serve-args", default="", help="more `outpace serve` flags for every server, e.g. "
                    "\"--num-kv-blocks 4096\"")
    b.set_defaults(func=cmd_bench)
    t = sub.add_parser("train", help="train the zoo models (see zoo/README.md)")
    tsub = t.add_subparsers(dest="what", required=True)
    tt = tsub.add_parser("target", help="a small Llama code model with chained MTP layers")
    _train_args(tt)
    tt.add_argument("--reproduce-steps", type=int, default=None,
                    help="instead of training: run the recipe's first N steps twice and compare the curves")
    tt.set_defaults(func=cmd_train_target)
    td = tsub.add_parser("draft", help="a draft for a trained target")
    td.add_argument("--method", required=True, choices=list(DRAFT_RECIPES))
    td.add_argument("--target", default=None, help="the target's directory (default: the zoo target)")
    td.add_argument("--data", nargs="+", default=None, metavar="FILE",
                    help="prompt files (.jsonl: one prompt per line; other: plain text cut into prompt windows); "
                         "the target regenerates the responses (default: the zoo corpus)")
    td.add_argument("--eval-prompts", default=None,
                    help="JSON list of held-out prompts for the final acceptance run (default: the zoo's)")
    td.add_argument("--num-continuations", type=int, help="continuations the target generates")
    td.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="any other recipe field (VALUE read as JSON, else as a string); repeatable")
    td.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                    help="training ranks started here (every --method): the target tensor-parallel over them, the "
                         "draft (mtp: the MTP layers) data-parallel with FSDP; or launch with torchrun "
                         "--nproc-per-node N")
    _train_args(td)
    td.set_defaults(func=cmd_train_draft)
    return parser


def _train_args(p: argparse.ArgumentParser) -> None:
    """Flags every recipe takes; --steps, --max-minutes and --seed override the recipe's values."""
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--toy", action="store_true", help="CPU-sized recipe (seconds)")
    p.add_argument("--steps", type=int)
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--seed", type=int)


def _recipe_overrides(a: argparse.Namespace, names: tuple[str, ...]) -> dict:
    return {n: getattr(a, n) for n in names if getattr(a, n, None) is not None}


def cmd_train_target(a: argparse.Namespace) -> None:
    from outpace.train.target import TargetRecipe, train_target

    overrides = _recipe_overrides(a, ("steps", "max_minutes", "seed"))
    recipe = TargetRecipe.toy(**overrides) if a.toy else TargetRecipe(**overrides)
    if a.reproduce_steps:
        from outpace.train.target import reproducibility_check

        result = reproducibility_check(recipe, a.reproduce_steps, a.device, Path(a.out))
        print(json.dumps({k: result[k] for k in ("max_abs_diff", "mean_abs_diff", "device")}))
        return
    metrics = train_target(recipe, Path(a.out), a.device)
    print(json.dumps({k: metrics[k] for k in ("heldout_loss", "heldout_top1", "mtp_heldout_top1",
                                              "train_wall_seconds", "num_parameters")}, indent=2))


# --method -> (recipe class, training function), imported lazily; each trains over any number of ranks
DRAFT_RECIPES = {
    "standalone": ("outpace.train.recipes.standalone:StandaloneRecipe", "outpace.train.recipes.standalone:train_standalone"),
    "eagle3": ("outpace.train.recipes.eagle3:Eagle3Recipe", "outpace.train.recipes.eagle3:train_eagle3"),
    "dflash": ("outpace.train.recipes.dflash:DFlashRecipe", "outpace.train.recipes.dflash:train_dflash"),
    "mtp": ("outpace.train.recipes.mtp:MTPRecipe", "outpace.train.recipes.mtp:train_mtp"),
}


def draft_recipe(a: argparse.Namespace):
    """The recipe that ``train draft``'s arguments ask for (the model cards write them back:
    train/model_card.py ``draft_train_command``)."""
    from outpace.registry import resolve

    recipe_cls = resolve({a.method: DRAFT_RECIPES[a.method][0]}, a.method, "draft recipe")
    overrides = _recipe_overrides(a, ("steps", "max_minutes", "seed", "eval_prompts", "num_continuations"))
    if a.data:
        overrides["prompt_files"] = tuple(a.data)
    overrides.update(_field_values(a.set))
    try:
        return recipe_cls.toy(**overrides) if a.toy else recipe_cls(**overrides)
    except TypeError as e:  # a --set field the recipe does not have
        raise ValueError(f"{recipe_cls.__name__}: {e}") from None


def cmd_train_draft(a: argparse.Namespace) -> None:
    from outpace.registry import resolve

    a.target = a.target or str(default_model())
    _check_model_dir(a.target)
    train_fn = resolve({a.method: DRAFT_RECIPES[a.method][1]}, a.method, "draft recipe")
    recipe = draft_recipe(a)
    from outpace.train.ranks import train_on_ranks

    metrics = train_on_ranks(train_fn, a.nproc_per_node, a.device, Path(a.target), recipe, Path(a.out), a.device)
    if metrics is None:  # a rank > 0 of a torchrun launch: rank 0 prints
        return
    keys = ("final_loss", "final_step_top1", "final_position_top1", "final_layer_top1", "train_wall_seconds",
            "num_parameters")
    summary = {k: metrics[k] for k in keys if k in metrics}
    for name, row in metrics.get("heldout", {}).items():
        if name.startswith("temperature"):
            summary[f"heldout tau ({name})"] = row["acceptance_length"]
    print(json.dumps(summary, indent=2))


def _field_values(pairs: list[str]) -> dict:
    """["field=value", ...] -> {field: value}, values read as JSON when they parse (lists become tuples)."""
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected FIELD=VALUE")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[name.replace("-", "_")] = tuple(value) if isinstance(value, list) else value
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed, with the model resolved (``_resolve_model``) where the command loads one."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "model") and not (args.command == "bench" and args.what in ("serve", "gpu", "e2e", "multi")):
        _resolve_model(args)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from outpace.validation import ConfigError

    try:
        args.func(args)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
