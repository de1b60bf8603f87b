"""``outpace serve``: the OpenAI-compatible HTTP server (README: Serve)."""

from __future__ import annotations

import argparse
import math
import os
import socket

from outpace.cli.engine_args import add_engine_args, check_model_dir, engine_kwargs
from outpace.config import EngineConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (see README: Serve)")
    add_engine_args(s, positional_model=True)
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=tcp_port, default=30000)
    s.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (or set OUTPACE_API_KEY)",
    )
    s.add_argument(
        "--served-model-name",
        default=None,
        help="the model's name in the API (default: its directory name)",
    )
    s.add_argument(
        "--max-num-seqs", type=int, default=64, help="requests in the running batch at most"
    )
    s.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's)"
    )
    s.add_argument(
        "--max-queued-requests",
        type=int,
        default=512,
        help="waiting requests at most; more are answered 429",
    )
    s.add_argument(
        "--max-tokens-limit",
        type=int,
        default=4096,
        help="largest max_tokens a request may ask for",
    )
    s.add_argument("--max-n", type=int, default=16, help="largest n (choices per prompt)")
    s.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="larger request bodies are answered 413",
    )
    s.add_argument(
        "--log-interval",
        type=positive_seconds,
        default=10.0,
        help="seconds between throughput/tau log lines (a finite number > 0)",
    )
    s.add_argument(
        "--drain-timeout",
        type=int,
        default=None,
        help="on SIGTERM, seconds to wait for in-flight requests (default: until they finish)",
    )
    s.add_argument(
        "--data-parallel-size",
        "--dp",
        type=int,
        default=1,
        metavar="M",
        help="engine replicas behind the server, each in its own process (and each tensor-parallel "
        "over --tensor-parallel-size ranks); requests go to the one with the shortest queue",
    )
    s.add_argument(
        "--engine-process",
        action="store_true",
        help="run the one engine in a process of its own, as each data-parallel replica runs, so "
        "that HTTP streaming and the engine's host work do not share one interpreter (implied by "
        "--data-parallel-size > 1)",
    )
    s.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split a chat's thinking into reasoning_content (deepseek_r1, deepseek_v3, qwen3, kimi_k2, "
        "nemotron_v3, step3p5, gemma4; SGLang's dashed spellings too)",
    )
    s.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="parse a chat's tool calls into tool_calls, in the model's format (e.g. hermes for Qwen, "
        "qwen3_coder, step3p5, deepseek_v3, deepseek_v31, kimi_k2, mistral, llama3_json, gemma4)",
    )
    s.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM's flag, taken so that its command lines serve: tool_choice auto is on wherever "
        "--tool-call-parser is given, and this flag needs it",
    )
    s.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE_OR_TEMPLATE",
        help="render chats with this Jinja template (a file, or the template itself) in the place of the "
        "tokenizer's, as vLLM's flag",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=run)


def tcp_port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1 to 65535)")
    return port


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (inf or nan would never log), else the flag's
    usage error."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"{text} is invalid: must be a finite number of seconds > 0"
        )
    return value


def check_can_listen(host: str, port: int) -> None:
    """Refuse an address the server could not listen on (a port in use, a host not of this machine)
    before the model loads, binding as uvicorn will and letting go at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            reason = e.strerror or str(e)
            raise ValueError(
                f"--host {host} --port {port}: cannot listen there ({reason})"
            ) from None


def run(a: argparse.Namespace) -> None:
    # NOTE: imported here, not at the top: the parser (and `outpace --help`) loads no torch
    from outpace.chat_messages import load_chat_template
    from outpace.server.app import run_server

    if a.enable_auto_tool_choice and not a.tool_call_parser:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (the model's call format)"
        )
    for flag, value in (("--api-key", a.api_key), ("--served-model-name", a.served_model_name)):
        if value == "":  # (an unset shell variable: an empty key would serve without one)
            raise ValueError(f"{flag} is empty: give a value, or leave the flag out")
    if a.drain_timeout is not None and a.drain_timeout < 0:
        raise ValueError(f"--drain-timeout {a.drain_timeout} is invalid: must be >= 0 seconds")
    check_model_dir(a.model)
    chat_template = None if a.chat_template is None else load_chat_template(a.chat_template)
    if os.environ.get("RANK", "0") == "0":  # (under torchrun only rank 0 serves: launch.py)
        check_can_listen(a.host, a.port)
    config = EngineConfig(
        model=a.model,
        max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len,
        **engine_kwargs(a),
    )
    run_server(
        config,
        host=a.host,
        port=a.port,
        log_level=a.log_level,
        served_model_name=a.served_model_name,
        api_key=a.api_key or os.environ.get("OUTPACE_API_KEY") or None,
        max_queued_requests=a.max_queued_requests,
        max_tokens_limit=a.max_tokens_limit,
        max_n=a.max_n,
        max_body_bytes=a.max_body_bytes,
        log_interval=a.log_interval,
        drain_timeout=a.drain_timeout,
        data_parallel_size=a.data_parallel_size,
        engine_process=a.engine_process,
        reasoning_parser=a.reasoning_parser,
        tool_call_parser=a.tool_call_parser,
        chat_template=chat_template,
    )
