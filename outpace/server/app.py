"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

``build_app`` loads the engine (``AsyncEngine``: one thread owns it) and returns a FastAPI app;
``run_server`` serves it with uvicorn. A request goes: guard (bearer token, body size) -> parse
and validate (400 naming the field) -> tokenize (worker thread) -> ``LLMEngine.new_request``
checks -> admission (429 when the queue is full) -> a ``GenerationStream``. The response runs
while a watcher listens for the client's disconnect; on disconnect (or any other end) the
stream's unfinished requests are aborted in the engine, which frees their KV blocks at once.

Each response carries its speculative metrics in the extension field ``spec_metrics``
(``SpecMetrics.to_dict()``): on the response object, on each choice, and in a stream on the
chunk that finishes a choice and on the usage chunk.
"""
from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from outpace.config import EngineConfig
from outpace.sampling_params import SamplingParams
from outpace.validation import ConfigError
from outpace.request import PositionLogprobs, RequestOutput
from outpace.server.async_engine import EngineError, GenerationStream, QueueFull
from outpace.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from outpace.server.replicas import serving_engine
from outpace.server.protocol import (APIError, ChatCompletionRequest, CompletionRequest, _SamplingFields,
                                     bad_request, parse_body)
from outpace.speculative.metrics import SpecMetrics

logger = logging.getLogger("outpace.server")

Send = Callable[[dict], Awaitable[None]]


class _BodyTooLarge(Exception):
    pass


class _Guard:
    """Pure ASGI middleware: the bearer token on /v1 routes (401) and the body size cap (413)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope.get("path", "").startswith("/v1"):
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                err = APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key", type="authentication_error")
                return await _send_json(send, 401, err.to_dict(), {"www-authenticate": "Bearer"})
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await _send_json(send, 413, _too_large(self.max_body_bytes).to_dict())
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
    return APIError(413, f"the request body is larger than the server's limit of {limit} bytes",
                    code="request_too_large")


async def _send_json(send: Send, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _GenerationResponse(Response):
    """Runs ``produce(send)`` while listening for the client's disconnect; on disconnect the
    producer is cancelled. ``on_close`` (the stream's abort) runs however it ends."""

    def __init__(self, produce: Callable[[Send], Awaitable[None]], on_close: Callable[[], None]) -> None:
        self.produce, self.on_close = produce, on_close
        self.background = None
        self.status_code = 200

    async def __call__(self, scope, receive, send) -> None:
        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        work, watch = asyncio.ensure_future(self.produce(send)), asyncio.ensure_future(listen())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watch):
                task.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)
            self.on_close()
        if work.done() and not work.cancelled() and work.exception() is not None:
            raise work.exception()
        if self.background is not None:
            await self.background()


class _TextDelta:
    """Streams the engine's cumulative text as deltas. Holds back a trailing U+FFFD (a partial
    UTF-8 character) and any tail that could start a stop string; the final text is authoritative."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.sent = 0

    def __call__(self, text: str, final: bool) -> str:
        end = len(text)
        if not final:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
            hold = 0
            for s in self.stops:
                for k in range(min(len(s) - 1, end - self.sent), hold, -1):
                    if text.endswith(s[:k], 0, end):
                        hold = k
                        break
            end -= hold
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent:end], end
        return delta


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _merged(outputs: list[RequestOutput]) -> dict:
    return SpecMetrics.total(out.spec_metrics for out in outputs).to_dict()


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _Job:
    """One validated HTTP generation request: its engine requests (prompts x n) and how to answer."""

    def __init__(self, chat: bool, body: _SamplingFields, prompt_ids: list[list[int]], prompt_texts: list[str],
                 model: str) -> None:
        self.chat, self.body, self.model = chat, body, model
        self.prompt_ids, self.prompt_texts = prompt_ids, prompt_texts
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.n = body.n
        self.per_prompt = body.sequences_per_prompt  # best_of sequences, the n most likely returned
        self.top_logprobs = body.wanted_logprobs()
        self.tokenizer = None  # the engine's, to show log-probabilities' tokens

    def prompt_of(self, index: int) -> int:
        return index // self.n

    def best(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Each prompt's ``n`` choices from its ``per_prompt`` sequences (by cumulative log-probability)."""
        if self.per_prompt == self.n:
            return outputs
        groups = [outputs[i:i + self.per_prompt] for i in range(0, len(outputs), self.per_prompt)]
        return [o for g in groups for o in sorted(g, key=lambda o: o.cumulative_logprob, reverse=True)[:self.n]]

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"token_id:{token_id}"

    def logprobs(self, out: RequestOutput) -> dict | None:
        """OpenAI's logprobs object of a choice (completions: tokens / token_logprobs / top_logprobs /
        text_offset; chat: content), from the target's raw log-probabilities."""
        if self.top_logprobs is None:
            return None
        entries: list[PositionLogprobs] = out.logprobs or []
        k = self.top_logprobs

        def top(entry: PositionLogprobs) -> list[tuple[int, float]]:
            ranked = sorted(entry.items(), key=lambda item: item[1].rank)
            return [(t, lp.logprob) for t, lp in ranked if lp.rank <= k]

        if self.chat:
            def item(t: int, lp: float) -> dict:
                text = self._token(t)
                return {"token": text, "logprob": lp, "bytes": list(text.encode())}
            return {"content": [{**item(t, e[t].logprob), "top_logprobs": [item(*p) for p in top(e)]}
                                for t, e in zip(out.token_ids, entries)]}
        tokens = [self._token(t) for t in out.token_ids]
        offsets = [sum(len(x) for x in tokens[:i]) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": [e[t].logprob for t, e in zip(out.token_ids, entries)],
                "top_logprobs": [{self._token(t): lp for t, lp in top(e)} for e in entries], "text_offset": offsets}

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_ids)

    def echo_prefix(self, index: int) -> str:
        return self.prompt_texts[self.prompt_of(index)] if not self.chat and self.body.echo else ""

    def choice(self, index: int, out: RequestOutput) -> dict:
        text = self.echo_prefix(index) + out.text
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=self.logprobs(out), finish_reason=out.finish_reason, stop_reason=out.stop_reason,
                      spec_metrics=out.spec_metrics.to_dict())
        return choice

    def response(self, outputs: list[RequestOutput]) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [self.choice(i, out) for i, out in enumerate(self.best(outputs))],
                "usage": _usage(self.num_prompt_tokens, sum(len(o.token_ids) for o in outputs)),
                "spec_metrics": _merged(outputs)}

    def chunk(self, index: int, text: str | None, finish: RequestOutput | None = None, role: bool = False) -> dict:
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish.finish_reason if finish else None)
        if finish is not None:
            choice["stop_reason"] = finish.stop_reason
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": [choice]}
        if finish is not None:
            chunk["spec_metrics"] = finish.spec_metrics.to_dict()
        if self.body.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, outputs: list[RequestOutput]) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [],
                "usage": _usage(self.num_prompt_tokens, sum(len(o.token_ids) for o in outputs)),
                "spec_metrics": _merged(outputs)}


def build_app(engine_config: EngineConfig, served_model_name: str | None = None, api_key: str | None = None,
              max_queued_requests: int | None = 512, max_tokens_limit: int = 4096, max_n: int = 16,
              max_choices: int = 64, max_body_bytes: int = 1 << 20, log_interval: float = 10.0,
              drain_timeout: float | None = None, data_parallel_size: int = 1,
              engine_process: bool = False) -> FastAPI:
    """Load the engine and build the app. The engine thread starts and stops with the app's lifespan;
    stopping finishes in-flight requests first (``drain_timeout`` bounds the wait, then aborts).

    Limits: ``max_queued_requests`` waiting requests (429 beyond; an empty queue always takes one
    request), ``max_tokens_limit`` per request, ``n <= max_n``, prompts x n <= ``max_choices``,
    bodies of ``max_body_bytes`` (413 beyond). With ``api_key`` the /v1 routes need the bearer token.
    ``data_parallel_size`` engine replicas serve behind it, each in a process of its own; one replica runs in
    this process unless ``engine_process`` (server/replicas.py ``serving_engine``).
    """
    for name, value in (("max_tokens_limit", max_tokens_limit), ("max_n", max_n), ("max_choices", max_choices),
                        ("max_body_bytes", max_body_bytes), ("log_interval", log_interval),
                        ("max_queued_requests", 1 if max_queued_requests is None else max_queued_requests)):
        if not value > 0:
            raise ConfigError(f"server {name}={value!r} is invalid: must be > 0")
    model_name = served_model_name or Path(engine_config.model).name or str(engine_config.model)
    metrics = ServerMetrics(model_name)
    engine = serving_engine(engine_config, metrics, log_interval, data_parallel_size, engine_process)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        spec = engine_config.speculative
        logger.info("serving %s (%s) with speculative method %s; max_model_len %d, %d KV blocks",
                    model_name, engine_config.model, spec.method, engine.max_model_len, engine.stats.kv_blocks_total)
        try:
            yield
        finally:
            logger.info("shutting down: finishing %d in-flight requests", engine.num_unfinished)
            await asyncio.to_thread(engine.stop, drain_timeout)
            logger.info("engine stopped")

    app = FastAPI(title="outpace", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
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
        return JSONResponse(err.to_dict(), status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(_BodyTooLarge)
    async def _too_large_error(request: Request, e: _BodyTooLarge):
        return JSONResponse(_too_large(max_body_bytes).to_dict(), status_code=413)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception):
        logger.exception("internal error on %s %s", request.method, request.url.path)
        err = APIError(500, f"internal server error: {type(e).__name__}", code="internal_error", type="server_error")
        return JSONResponse(err.to_dict(), status_code=500)

    # ---- plain endpoints --------------------------------------------------------------------
    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "outpace",
                "root": str(engine_config.model), "max_model_len": engine.max_model_len}

    @app.get("/health")
    async def health():
        st = engine.stats
        body = {"status": "ok" if engine.alive else "error", "model": model_name,
                "num_requests_running": st.num_running, "num_requests_waiting": st.num_waiting,
                "num_requests_unfinished": engine.num_unfinished,
                "kv_blocks_free": st.kv_blocks_free, "kv_blocks_total": st.kv_blocks_total, **engine.health()}
        return JSONResponse(body, status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str):
        check_model(model)
        return model_card()

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(404, f"the model {name!r} does not exist: this server serves {model_name!r}",
                           "model", "model_not_found")

    # ---- generation ---------------------------------------------------------------------------
    async def read(request: Request, model_cls):
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
        body.check_supported()
        if body.n > max_n:
            raise bad_request(f"n={body.n} is more than the server's limit of {max_n}", "n")
        return body

    def tokenize_prompts(body: CompletionRequest) -> tuple[list[list[int]], list[str]]:
        prompts = body.prompts()
        if len(prompts) * body.sequences_per_prompt > max_choices:
            raise bad_request(f"{len(prompts)} prompts x {body.sequences_per_prompt} sequences (n, best_of) is more "
                              f"than the server's limit of {max_choices} choices per request", "prompt")
        ids, texts = [], []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if not p:
                    raise bad_request("prompt is empty" if len(prompts) == 1 else f"prompt {i} is empty", "prompt")
                if engine.tokenizer is None:
                    raise bad_request("this model has no tokenizer: send the prompt as token ids", "prompt")
                ids.append(engine.tokenizer.encode(p, add_special_tokens=True))
                texts.append(p)
            else:
                if not p:
                    raise bad_request(f"prompt {i} is empty", "prompt")
                bad = [t for t in p if not 0 <= t < engine.vocab_size]
                if bad:
                    raise bad_request(f"prompt token ids {bad[:5]} are outside the vocabulary "
                                      f"[0, {engine.vocab_size})", "prompt")
                ids.append(p)
                texts.append(engine.tokenizer.decode(p) if body.echo and engine.tokenizer is not None else "")
        return ids, texts

    def tokenize_chat(body: ChatCompletionRequest) -> tuple[list[list[int]], list[str]]:
        tok = engine.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise bad_request("this model has no chat template: use /v1/completions", "messages")
        try:
            text = tok.apply_chat_template(body.conversation(), tokenize=False,
                                           add_generation_prompt=body.add_generation_prompt)
        except APIError:
            raise
        except Exception as e:  # noqa: BLE001 - jinja raises for roles or shapes the template refuses
            raise bad_request(f"the chat template refused the messages: {e}", "messages") from None
        # NOTE: the template already holds any special tokens, so none are added (as vLLM does).
        return [tok.encode(text, add_special_tokens=False)], [text]

    def sampling_params(body: _SamplingFields, prompt_len: int, param: str) -> SamplingParams:
        requested, name = body.requested_max_tokens()
        room = engine.max_model_len - prompt_len
        if room < 1:
            raise bad_request(f"the prompt has {prompt_len} tokens but the model's context holds "
                              f"{engine.max_model_len}: at most {engine.max_model_len - 1} prompt tokens leave "
                              "room to generate", param, "context_length_exceeded")
        if requested is None:
            max_tokens = min(room, max_tokens_limit, 16 if isinstance(body, CompletionRequest) else room)
        else:
            if requested > max_tokens_limit:
                raise bad_request(f"{name}={requested} is more than the server's limit of {max_tokens_limit}", name)
            if requested > room:
                raise bad_request(f"this model's maximum context length is {engine.max_model_len} tokens, but "
                                  f"{prompt_len + requested} were requested ({prompt_len} in the prompt, "
                                  f"{requested} for the completion): lower {name} or shorten the prompt",
                                  name, "context_length_exceeded")
            max_tokens = requested
        logprobs = body.wanted_logprobs()
        if logprobs is None and body.sequences_per_prompt > body.n:
            logprobs = 0  # best_of ranks by cumulative log-probability
        try:
            return SamplingParams(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                min_p=body.min_p or 0.0, max_tokens=max_tokens, stop=tuple(body.stop),
                stop_token_ids=tuple(body.stop_token_ids or ()), seed=body.seed, ignore_eos=body.ignore_eos,
                presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                repetition_penalty=body.repetition_penalty or 1.0, logit_bias=body.logit_bias_ids(),
                logprobs=logprobs, structured_outputs=body.constraint())
        except ConfigError as e:
            raise bad_request(str(e).removeprefix("SamplingParams."), str(e).split("=")[0].split(".")[-1]) from None

    async def generate(request: Request, chat: bool):
        body = await read(request, ChatCompletionRequest if chat else CompletionRequest)
        prompt_ids, prompt_texts = await asyncio.to_thread(tokenize_chat if chat else tokenize_prompts, body)
        param = "messages" if chat else "prompt"
        job = _Job(chat, body, prompt_ids, prompt_texts, model_name)
        job.tokenizer = engine.tokenizer
        requests, per_prompt = [], body.sequences_per_prompt
        for p, ids in enumerate(prompt_ids):
            params = sampling_params(body, len(ids), param)
            for c in range(per_prompt):
                seeded = params if params.seed is None or c == 0 else params.replace(seed=(params.seed + c) % 2**63)
                try:
                    requests.append(engine.new_request(ids, seeded, f"{job.id}-{p * per_prompt + c}"))
                except ValueError as e:
                    raise bad_request(str(e), param) from None
        try:
            stream = engine.open_stream(requests, max_queued_requests)
        except QueueFull as e:
            raise APIError(429, str(e), code="queue_full", type="server_overloaded") from None
        except EngineError as e:
            raise APIError(503, str(e), code="engine_unavailable", type="server_error") from None
        produce = _stream_producer(job, stream) if body.stream else _json_producer(job, stream)
        return _GenerationResponse(produce, stream.abort)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return app


def _json_producer(job: _Job, stream: GenerationStream):
    async def produce(send: Send) -> None:
        outputs: list[RequestOutput | None] = [None] * len(stream.requests)
        try:
            async for index, out in stream:
                if out.finished:
                    outputs[index] = out
        except EngineError as e:
            err = APIError(500, str(e), code="engine_error", type="server_error")
            return await _send_json(send, 500, err.to_dict())
        await _send_json(send, 200, job.response(outputs))
    return produce


def _stream_producer(job: _Job, stream: GenerationStream):
    async def produce(send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]})
        async for event in _events(job, stream):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return produce


async def _events(job: _Job, stream: GenerationStream) -> AsyncIterator[bytes]:
    num = len(stream.requests)
    deltas = [_TextDelta(r.params.stop) for r in stream.requests]
    finals: list[RequestOutput | None] = [None] * num
    for index in range(num):  # the opening chunk: the role (chat) or the echoed prompt
        if job.chat:
            yield _sse(job.chunk(index, "", role=True))
        elif job.echo_prefix(index):
            yield _sse(job.chunk(index, job.echo_prefix(index)))
    try:
        async for index, out in stream:
            text = deltas[index](out.text, out.finished)
            if out.finished:
                finals[index] = out
                if text:
                    yield _sse(job.chunk(index, text))
                yield _sse(job.chunk(index, None if job.chat else "", finish=out))
            elif text:
                yield _sse(job.chunk(index, text))
    except EngineError as e:
        yield _sse(APIError(500, str(e), code="engine_error", type="server_error").to_dict())
        yield b"data: [DONE]\n\n"
        return
    if job.body.include_usage:
        yield _sse(job.usage_chunk(finals))
    yield b"data: [DONE]\n\n"


def run_server(engine_config: EngineConfig, host: str = "127.0.0.1", port: int = 30000,
               log_level: str = "info", **app_kwargs: Any) -> None:
    """Serve until SIGTERM or SIGINT: then stop accepting, finish in-flight requests, stop the
    engine thread and return (the process exits 0)."""
    import uvicorn

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(engine_config, **app_kwargs)
    # NOTE: the engine's objects live as long as the process: frozen, the garbage collector's full passes
    # no longer scan them (one took 0.1-0.3 s inside a decode step on the H100: benchmarks/scripts/diag_first_use.py;
    # vLLM freezes its start-up heap likewise).
    gc.collect()
    gc.freeze()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                           timeout_graceful_shutdown=app_kwargs.get("drain_timeout")))
    # NOTE: uvicorn re-raises the signal it shut down on once it is done; these no-op handlers
    # make that a clean return instead of a death by SIGTERM (or a KeyboardInterrupt).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
