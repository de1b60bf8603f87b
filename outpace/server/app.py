"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models, and vLLM's
/tokenize, /detokenize and /version, beside /health and /metrics.

``build_app`` loads the engine (``AsyncEngine``: one thread owns it) and returns a FastAPI app;
``run_server`` serves it with uvicorn. A request goes: guard (bearer token, body size) -> parse
and validate (400 naming the field; server/protocol.py) -> tokenize (worker thread) and build the
engine's requests (server/request_inputs.py) -> ``LLMEngine.new_request`` checks -> admission (429
when the queue is full) -> a ``GenerationStream``, answered as one JSON body or as a stream of chunks
(server/streaming.py, shapes in server/responses.py). The response runs while a watcher listens for
the client's disconnect; on disconnect (or any other end) the stream's unfinished requests are
aborted in the engine, which frees their KV blocks at once.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import signal
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from outpace import __version__
from outpace.config import EngineConfig
from outpace.generation_defaults import read_generation_defaults
from outpace.server.async_engine import EngineError, QueueFull
from outpace.server.chat_output import ChatParsers
from outpace.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from outpace.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    bad_request,
    parse_body,
)
from outpace.server.reasoning import reasoning_format
from outpace.server.replicas import serving_engine
from outpace.server.request_inputs import RequestInputs
from outpace.server.responses import Job
from outpace.server.streaming import GenerationResponse, json_producer, send_json, stream_producer
from outpace.server.tool_calls import tool_call_format
from outpace.validation import ConfigError, is_finite_number

logger = logging.getLogger("outpace.server")

GUARDED_PATHS = ("/v1", "/tokenize", "/detokenize")  # what needs the bearer token, with --api-key


class _BodyTooLarge(Exception):
    pass


class _Guard:
    """Pure ASGI middleware: the bearer token on ``GUARDED_PATHS`` (401) and the body size cap (413)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        if self.api_key is not None and scope.get("path", "").startswith(GUARDED_PATHS):
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.api_key.encode()
            ):
                err = APIError(
                    401,
                    "missing or invalid API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                    type="authentication_error",
                )
                return await send_json(send, 401, err.to_dict(), {"www-authenticate": "Bearer"})
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await send_json(send, 413, _too_large(self.max_body_bytes).to_dict())
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _BodyTooLarge()
            return message

        await self.app(scope, limited_receive, send)


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than the server's limit of {limit} bytes",
        code="request_too_large",
    )


def build_app(
    engine_config: EngineConfig,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queued_requests: int | None = 512,
    max_tokens_limit: int = 4096,
    max_n: int = 16,
    max_choices: int = 64,
    max_body_bytes: int = 1 << 20,
    log_interval: float = 10.0,
    drain_timeout: float | None = None,
    data_parallel_size: int = 1,
    engine_process: bool = False,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    chat_template: str | None = None,
) -> FastAPI:
    """Load the engine and build the app. The engine thread starts and stops with the app's lifespan;
    stopping finishes in-flight requests first (``drain_timeout`` bounds the wait, then aborts).

    Limits: ``max_queued_requests`` requests waiting for a place in the running batch (429 beyond; with
    none waiting, one group is taken whatever its size: async_engine.py ``open_stream``), ``max_tokens_limit``
    per request, ``n <= max_n``, prompts x n <= ``max_choices``,
    bodies of ``max_body_bytes`` (413 beyond). With ``api_key`` the /v1 routes and /tokenize,
    /detokenize need the bearer token. ``data_parallel_size`` engine replicas serve behind it, each
    in a process of its own; one replica runs in this process unless ``engine_process``
    (server/replicas.py ``serving_engine``). ``reasoning_parser`` and ``tool_call_parser`` name the formats a
    chat's thinking and tool calls are parsed from (server/chat_output.py). ``chat_template`` (a template's text)
    renders chats in the place of the tokenizer's template (``--chat-template``).
    """
    try:  # (before the model loads)
        thinking = reasoning_format(reasoning_parser) if reasoning_parser else None
        tool_calls = tool_call_format(tool_call_parser) if tool_call_parser else None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    limits = (
        ("max_tokens_limit", max_tokens_limit),
        ("max_n", max_n),
        ("max_choices", max_choices),
        ("max_body_bytes", max_body_bytes),
        ("max_queued_requests", 1 if max_queued_requests is None else max_queued_requests),
    )
    for name, value in limits:
        if not value > 0:
            raise ConfigError(f"server {name}={value!r} is invalid: must be > 0")
    if not (is_finite_number(log_interval) and log_interval > 0):  # (inf or nan would never log)
        raise ConfigError(
            f"server log_interval={log_interval!r} is invalid: "
            "must be a finite number of seconds > 0"
        )
    defaults = read_generation_defaults(  # (before the model loads)
        engine_config.model,
        engine_config.generation_config,
        engine_config.override_generation_config,
    )
    defaults.log()
    model_name = served_model_name or Path(engine_config.model).name or str(engine_config.model)
    metrics = ServerMetrics(model_name)
    engine = serving_engine(
        engine_config, metrics, log_interval, data_parallel_size, engine_process
    )
    inputs = RequestInputs(engine, max_tokens_limit, max_choices, defaults, chat_template)
    parsers = ChatParsers.of(thinking, tool_calls, engine.tokenizer)
    created = int(time.time())
    permission = {  # vLLM's ModelPermission, as its /v1/models lists it
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        spec = engine_config.speculative
        logger.info(
            "serving %s (%s) with speculative method %s; max_model_len %d, %d KV blocks",
            model_name,
            engine_config.model,
            spec.method,
            engine.max_model_len,
            engine.stats.kv_blocks_total,
        )
        try:
            yield
        finally:
            logger.info("shutting down: finishing %d in-flight requests", engine.num_unfinished)
            await asyncio.to_thread(engine.stop, drain_timeout)
            logger.info("engine stopped")

    app = FastAPI(
        title="outpace", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.engine = engine
    app.state.metrics = metrics
    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes)

    # ---- errors ---------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(e.to_dict(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        err = APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code)
        headers = getattr(e, "headers", None)
        return JSONResponse(err.to_dict(), status_code=e.status_code, headers=headers)

    @app.exception_handler(_BodyTooLarge)
    async def _too_large_error(request: Request, e: _BodyTooLarge):
        return JSONResponse(_too_large(max_body_bytes).to_dict(), status_code=413)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception):
        logger.exception("internal error on %s %s", request.method, request.url.path)
        err = APIError(
            500,
            f"internal server error: {type(e).__name__}",
            code="internal_error",
            type="server_error",
        )
        return JSONResponse(err.to_dict(), status_code=500)

    # ---- plain endpoints --------------------------------------------------------------------
    def model_card() -> dict:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "outpace",
            "root": str(engine_config.model),
            "parent": None,
            "max_model_len": engine.max_model_len,
            "permission": [permission],
        }

    @app.get("/health")
    async def health():
        st = engine.stats
        body = {
            "status": "ok" if engine.alive else "error",
            "model": model_name,
            "num_requests_running": st.num_running,
            "num_requests_waiting": st.num_waiting,
            "num_requests_unfinished": engine.num_unfinished,
            "kv_blocks_free": st.kv_blocks_free,
            "kv_blocks_total": st.kv_blocks_total,
            **engine.health(),
        }
        return JSONResponse(body, status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str):
        check_model(model)
        return model_card()

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(
                404,
                f"the model {name!r} does not exist: this server serves {model_name!r}",
                "model",
                "model_not_found",
            )

    async def read(request: Request, model_cls):
        """The request's body, parsed and validated (400 naming the field), for this model."""
        try:
            raw = await request.body()
        except _BodyTooLarge:
            raise _too_large(max_body_bytes) from None
        except ClientDisconnect:  # gone while uploading: nobody reads the answer
            raise bad_request("the client disconnected before sending the whole body") from None
        if not raw.strip():
            raise bad_request("the request body is empty: send a JSON object")
        body = parse_body(model_cls, raw)
        check_model(body.model)
        return body

    # ---- vLLM's tokenizer endpoints ----------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read(request, TokenizeRequest)
        body.check_supported()
        tok = inputs.tokenizer()

        def run() -> list[int]:
            if body.prompt is not None:
                return tok.encode(body.prompt, add_special_tokens=body.special_tokens)
            text = inputs.chat_text(
                body.messages,
                body.add_generation_prompt,
                body.tool_dicts(),
                body.chat_template_kwargs,
                body.continue_final_message,
            )
            return tok.encode(text, add_special_tokens=body.special_tokens)

        ids = await asyncio.to_thread(run)
        strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {
            "count": len(ids),
            "max_model_len": engine.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read(request, DetokenizeRequest)
        tok = inputs.tokenizer()
        bad = [t for t in body.tokens if t >= engine.vocab_size]
        if bad:
            raise bad_request(
                f"token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})", "tokens"
            )
        return {"prompt": await asyncio.to_thread(tok.decode, body.tokens)}

    # ---- generation ---------------------------------------------------------------------------
    async def generate(request: Request, chat: bool):
        body = await read(request, ChatCompletionRequest if chat else CompletionRequest)
        body.check_supported()
        if body.n > max_n:
            raise bad_request(f"n={body.n} is more than the server's limit of {max_n}", "n")
        prompt_ids, prompt_texts = await asyncio.to_thread(
            inputs.tokenize_chat if chat else inputs.tokenize_prompts, body
        )
        param = "messages" if chat else "prompt"
        parsing = parsers.for_request(body, prompt_texts[0]) if chat else None
        job = Job(chat, body, prompt_ids, prompt_texts, model_name, engine.tokenizer, parsing)
        # (off the event loop: a constraint's first compile took seconds for a large enum, every stream stalled)
        requests = await asyncio.to_thread(inputs.engine_requests, body, job.id, prompt_ids, param)
        try:
            stream = engine.open_stream(requests, max_queued_requests)
        except QueueFull as e:
            raise APIError(429, str(e), code="queue_full", type="server_overloaded") from None
        except EngineError as e:
            raise APIError(503, str(e), code="engine_unavailable", type="server_error") from None
        produce = (stream_producer if body.stream else json_producer)(job, stream)
        return GenerationResponse(produce, stream.abort)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return app


def run_server(
    engine_config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 30000,
    log_level: str = "info",
    **app_kwargs: Any,
) -> None:
    """Serve until SIGTERM or SIGINT: then stop accepting, finish in-flight requests, stop the
    engine thread and return (the process exits 0). An engine of several ranks that lost one shuts the
    server down too, and raises SystemExit naming the lost rank (exit 1)."""
    import uvicorn

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    app = build_app(engine_config, **app_kwargs)
    # NOTE: the engine's objects live as long as the process: frozen, the garbage collector's full passes
    # no longer scan them (one took 0.1-0.3 s inside a decode step on the H100: benchmarks/scripts/diag_first_use.py;
    # vLLM freezes its start-up heap likewise).
    gc.collect()
    gc.freeze()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=app_kwargs.get("drain_timeout"),
        )
    )
    # NOTE: uvicorn re-raises the signal it shut down on once it is done; these no-op handlers
    # make that a clean return instead of a death by SIGTERM (or a KeyboardInterrupt).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    engine = app.state.engine
    threading.Thread(
        target=_stop_on_fatal_error, args=(engine, server), name="outpace-watch", daemon=True
    ).start()
    server.run()
    fatal = getattr(engine, "fatal_error", None)
    if fatal is not None:
        raise SystemExit(f"outpace serve: the engine stopped: {fatal}")


def _stop_on_fatal_error(engine, server, interval_s: float = 0.5) -> None:
    """Shut the server down (as on SIGTERM) once an engine of several ranks has failed for good: with a
    rank lost, it cannot serve again (async_engine.py ``fatal_error``)."""
    while not server.should_exit:
        if getattr(engine, "fatal_error", None) is not None:
            logger.error("the engine's ranks cannot go on: shutting the server down")
            server.should_exit = True
            return
        time.sleep(interval_s)
