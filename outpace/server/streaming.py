"""Sending a generation over HTTP: the whole JSON answer, or a server-sent-event stream of chunks.

A producer (``json_producer``, ``stream_producer``) writes the answer of a ``GenerationStream``;
``GenerationResponse`` runs it while watching for the client's disconnect.

A stream opens with a chunk per choice (chat: the role; completions with ``echo``: the prompt), then
sends each choice's new text as it comes (``TextDelta``), with the log-probabilities of the tokens
that arrived since the choice's last chunk when asked (a chat's reasoning and tool calls parsed from it where
the server parses them: server/chat_output.py ``ChoiceStream``); a chunk with the finish reason ends each
choice, a usage chunk (``include_usage``) and ``[DONE]`` end the stream. With echo and logprobs the
prompt's chunk waits for the prompt's log-probabilities, which exist once the prompt has run.
A failure once the stream is under way (the engine's, or a fault of ours) ends it with an error event and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response

from outpace.request import RequestOutput
from outpace.server.async_engine import EngineError, GenerationStream
from outpace.server.chat_output import ChoiceStream
from outpace.server.protocol import APIError
from outpace.server.responses import Job, sse

Send = Callable[[dict], Awaitable[None]]

logger = logging.getLogger("outpace.server")


async def send_json(
    send: Send, status: int, payload: Any, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class GenerationResponse(Response):
    """Runs ``produce(send)`` while listening for the client's disconnect; on disconnect the
    producer is cancelled. ``on_close`` (the stream's abort) runs however it ends."""

    def __init__(
        self, produce: Callable[[Send], Awaitable[None]], on_close: Callable[[], None]
    ) -> None:
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


def _engine_error(job: Job, e: EngineError) -> dict:
    """The 500 body of an engine failure; a grammar's dead end names the field the request constrained its
    output with (protocol.py ``name_constraint``)."""
    message = job.body.name_constraint(str(e))
    return APIError(500, message, code="engine_error", type="server_error").to_dict()


def json_producer(job: Job, stream: GenerationStream):
    async def produce(send: Send) -> None:
        outputs: list[RequestOutput | None] = [None] * len(stream.requests)
        try:
            async for index, out in stream:
                if out.finished:
                    outputs[index] = out
        except EngineError as e:
            return await send_json(send, 500, _engine_error(job, e))
        await send_json(send, 200, job.response(outputs))

    return produce


def stream_producer(job: Job, stream: GenerationStream):
    async def produce(send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for event in events(job, stream):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return produce


class TextDelta:
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
        delta, self.sent = text[self.sent : end], end
        return delta


@dataclass
class _ChoiceState:
    """What one choice of a stream has sent so far."""

    text: TextDelta
    parsed: ChoiceStream | None = None  # a chat's reasoning and tool calls (server/chat_output.py)
    echoed: bool = False
    tokens: int = 0  # output tokens whose log-probabilities were sent
    # completions' text_offset of the next token whose log-probabilities go out: the texts of the tokens before it, as
    # the whole answer counts them (not the text sent, which lags where a stop string's prefix is held back)
    offset: int = 0


def _next_offset(logprobs: dict, offset: int) -> int:
    """The text_offset after the tokens of a completions' logprobs object (``offset`` where it has none)."""
    tokens = logprobs.get("tokens")
    return logprobs["text_offset"][-1] + len(tokens[-1]) if tokens else offset


async def events(job: Job, stream: GenerationStream) -> AsyncIterator[bytes]:
    num = len(stream.requests)
    parsing = job.parsing
    states = [
        _ChoiceState(TextDelta(r.params.stop), parsing.stream() if parsing else None)
        for r in stream.requests
    ]
    finals: list[RequestOutput | None] = [None] * num
    with_logprobs = job.top_logprobs is not None
    for index in range(num):  # the opening chunk: the role (chat) or the echoed prompt
        if job.chat:
            yield sse(job.chunk(index, "", role=True))
        elif job.echo and not with_logprobs:
            yield sse(job.chunk(index, job.echo_prefix(index)))
            states[index].echoed = True
    try:
        async for index, out in stream:
            state, num_tokens = states[index], job.num_output_tokens(out)
            if job.echo and not state.echoed:
                state.echoed, prefix = True, job.echo_prefix(index)
                lp = job.prompt_logprobs(out)
                yield sse(job.chunk(index, prefix, logprobs=lp, num_output_tokens=num_tokens))
                state.offset = _next_offset(lp, 0)
            text = "" if job.echo_only else state.text(out.text, out.finished)
            lp = None
            if with_logprobs and num_tokens > state.tokens:
                lp = job.output_logprobs(out, state.tokens, state.offset)
                state.tokens = num_tokens
                if not job.chat:
                    state.offset = _next_offset(lp, state.offset)
            fields = None
            if state.parsed is not None:  # the text goes out as the fields parsed from it
                text, fields = None, state.parsed.feed(text, out.finished)
            if text or fields or lp is not None:
                yield sse(job.chunk(index, text, lp, num_tokens, fields))
            if out.finished:
                finals[index] = out
                final = None if job.chat else ""
                num_calls = state.parsed.num_calls if state.parsed is not None else 0
                yield sse(
                    job.chunk(
                        index, final, finish=out, num_output_tokens=num_tokens, num_calls=num_calls
                    )
                )
    except EngineError as e:
        yield sse(_engine_error(job, e))
        yield b"data: [DONE]\n\n"
        return
    except Exception as e:  # noqa: BLE001 - a fault of ours: the client still reads an error and [DONE], as vLLM's
        logger.exception("internal error while streaming %s", job.id)
        message = f"internal server error: {type(e).__name__}"  # (app.py's 500, no internals)
        yield sse(APIError(500, message, code="internal_error", type="server_error").to_dict())
        yield b"data: [DONE]\n\n"
        return
    if job.body.include_usage:
        yield sse(job.usage_chunk(finals))
    yield b"data: [DONE]\n\n"
