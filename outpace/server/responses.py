"""The OpenAI response bodies of one generation request (``Job``): choices, stream chunks, usage and
log-probabilities, in vLLM's layout.

Completions' ``logprobs`` object: per token its text (``tokens``), its log-probability
(``token_logprobs``), a dict of the token itself and the ``logprobs`` most likely tokens
(``top_logprobs``: up to logprobs + 1 entries, as OpenAI's legacy API and vLLM give) and its offset in
the text (``text_offset``). With ``echo`` the prompt's tokens come first; nothing predicts the
prompt's first token, so its log-probability and top dict are null. Chat's ``logprobs.content``
lists per token its text, log-probability, bytes and the ``top_logprobs`` most likely tokens. A chat's
message or delta holds ``reasoning_content`` and ``tool_calls`` where the server parses them
(server/chat_output.py).
A log-probability of -inf shows as -9999.0 (JSON has no infinity; vLLM's value).

Each response carries its speculative metrics in the extension field ``spec_metrics``
(``SpecMetrics.to_dict()``): on the response object, on each choice, and in a stream on the chunk
that finishes a choice and on the usage chunk.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from outpace.request import PositionLogprobs, RequestOutput
from outpace.server.chat_output import ChatParsing
from outpace.server.protocol import SamplingFields
from outpace.speculative.metrics import SpecMetrics

LOGPROB_FLOOR = -9999.0


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _shown(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def completion_logprobs(
    token_ids: Sequence[int],
    entries: Sequence[PositionLogprobs | None],
    k: int,
    text_of: Callable[[int], str],
    offset: int = 0,
) -> dict:
    """Completions' logprobs object of ``token_ids`` (their text starting at ``offset``); an entry of
    None (the prompt's first token) shows null."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for t, entry in zip(token_ids, entries):
        text = text_of(t)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_shown(entry[t].logprob))
        # NOTE: an entry holds the token itself first, then the k most likely (PositionLogprobs).
        top = list(entry.items())[: k + 1]
        top_logprobs.append({text_of(tok): _shown(lp.logprob) for tok, lp in top})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def chat_logprobs(
    token_ids: Sequence[int],
    entries: Sequence[PositionLogprobs],
    k: int,
    text_of: Callable[[int], str],
) -> dict:
    """Chat's logprobs object of ``token_ids``: each token and its ``k`` most likely alternatives."""

    def item(t: int, logprob: float) -> dict:
        text = text_of(t)
        return {"token": text, "logprob": _shown(logprob), "bytes": list(text.encode())}

    content = []
    for t, entry in zip(token_ids, entries):
        ranked = sorted(entry.items(), key=lambda pair: pair[1].rank)
        top = [item(tok, lp.logprob) for tok, lp in ranked if lp.rank <= k]
        content.append({**item(t, entry[t].logprob), "top_logprobs": top})
    return {"content": content}


class Job:
    """One validated HTTP generation request: its engine requests (prompts x n) and how to answer."""

    def __init__(
        self,
        chat: bool,
        body: SamplingFields,
        prompt_ids: list[list[int]],
        prompt_texts: list[str],
        model: str,
        tokenizer=None,
        parsing: ChatParsing | None = None,
    ) -> None:
        """``parsing``: a chat's reasoning and tool-call parsing (server/chat_output.py), None for none."""
        self.chat, self.body, self.model = chat, body, model
        self.parsing = parsing if parsing is not None and parsing.parses else None
        self.prompt_ids, self.prompt_texts = prompt_ids, prompt_texts
        self.tokenizer = tokenizer  # the engine's, to show log-probabilities' tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.n = body.n
        self.per_prompt = body.sequences_per_prompt  # best_of sequences, the n most likely returned
        self.top_logprobs = body.wanted_logprobs()
        self.echo = not chat and body.echo
        self.echo_only = (
            not chat and body.echo_only
        )  # the prompt alone: the one token made is dropped

    def prompt_of(self, index: int) -> int:
        return index // self.n

    def best(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Each prompt's ``n`` choices from its ``per_prompt`` sequences (by cumulative log-probability)."""
        if self.per_prompt == self.n:
            return outputs
        groups = [outputs[i : i + self.per_prompt] for i in range(0, len(outputs), self.per_prompt)]
        return [
            o
            for g in groups
            for o in sorted(g, key=lambda o: o.cumulative_logprob, reverse=True)[: self.n]
        ]

    def text_of(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def echo_prefix(self, index: int) -> str:
        return self.prompt_texts[self.prompt_of(index)] if self.echo else ""

    def num_output_tokens(self, out: RequestOutput) -> int:
        return 0 if self.echo_only else len(out.token_ids)

    def _prompt_entries(self, out: RequestOutput) -> list[PositionLogprobs | None]:
        """The prompt's entries (None for the first token, and for any the engine had not reached
        when the request was aborted)."""
        entries = list(out.prompt_logprobs or [None])
        return entries + [None] * (len(out.prompt_token_ids) - len(entries))

    def prompt_logprobs(self, out: RequestOutput) -> dict:
        """The echoed prompt's logprobs object (completions)."""
        entries = self._prompt_entries(out)
        return completion_logprobs(out.prompt_token_ids, entries, self.top_logprobs, self.text_of)

    def output_logprobs(self, out: RequestOutput, start: int = 0, offset: int = 0) -> dict:
        """The logprobs object of ``out``'s tokens from ``start`` on (text at ``offset``)."""
        ids, entries = out.token_ids[start:], (out.logprobs or [])[start:]
        if self.chat:
            return chat_logprobs(ids, entries, self.top_logprobs, self.text_of)
        return completion_logprobs(ids, entries, self.top_logprobs, self.text_of, offset)

    def logprobs(self, out: RequestOutput) -> dict | None:
        """A finished choice's logprobs object (echo: the prompt's tokens, then the output's)."""
        if self.top_logprobs is None:
            return None
        if not self.echo:
            return self.output_logprobs(out)
        ids, entries = list(out.prompt_token_ids), self._prompt_entries(out)
        if not self.echo_only:
            ids, entries = ids + list(out.token_ids), entries + list(out.logprobs or [])
        return completion_logprobs(ids, entries, self.top_logprobs, self.text_of)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_ids)

    def choice(self, index: int, out: RequestOutput) -> dict:
        text = self.echo_prefix(index) + ("" if self.echo_only else out.text)
        choice: dict[str, Any] = {"index": index}
        num_calls = 0
        if self.parsing is not None:
            choice["message"] = self.parsing.message(text)
            num_calls = len(choice["message"].get("tool_calls", ()))
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(
            logprobs=self.logprobs(out),
            finish_reason=self.finish_reason(out.finish_reason, num_calls),
            stop_reason=out.stop_reason,
            spec_metrics=out.spec_metrics.to_dict(),
        )
        return choice

    def finish_reason(self, reason: str | None, num_calls: int) -> str | None:
        """A choice's finish reason: with the chat's parsing, "tool_calls" where the model chose the calls
        (server/chat_output.py ``ChatParsing.finish_reason``)."""
        return reason if self.parsing is None else self.parsing.finish_reason(reason, num_calls)

    def _usage(self, outputs: list[RequestOutput]) -> dict:
        return usage(self.num_prompt_tokens, sum(self.num_output_tokens(o) for o in outputs))

    def response(self, outputs: list[RequestOutput]) -> dict:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [self.choice(i, out) for i, out in enumerate(self.best(outputs))],
            "usage": self._usage(outputs),
            "spec_metrics": _merged(outputs),
        }

    def chunk(
        self,
        index: int,
        text: str | None,
        logprobs: dict | None = None,
        num_output_tokens: int = 0,
        fields: dict[str, Any] | None = None,
        finish: RequestOutput | None = None,
        num_calls: int = 0,
        role: bool = False,
    ) -> dict:
        """A stream chunk of choice ``index``; with ``continuous_usage_stats`` its usage so far
        (``num_output_tokens``). A chat's delta holds ``text`` as its content, or the parsed ``fields``
        (server/chat_output.py ``ChoiceStream``); ``num_calls``: the tool calls the choice sent."""
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            delta.update(fields or {})
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        reason = self.finish_reason(finish.finish_reason, num_calls) if finish else None
        choice.update(logprobs=logprobs, finish_reason=reason)
        if finish is not None:
            choice["stop_reason"] = finish.stop_reason
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if finish is not None:
            chunk["spec_metrics"] = finish.spec_metrics.to_dict()
        if self.body.continuous_usage:
            prompt_tokens = len(self.prompt_ids[self.prompt_of(index)])
            chunk["usage"] = usage(prompt_tokens, num_output_tokens)
        elif self.body.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, outputs: list[RequestOutput]) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self._usage(outputs),
            "spec_metrics": _merged(outputs),
        }


def _merged(outputs: list[RequestOutput]) -> dict:
    return SpecMetrics.total(out.spec_metrics for out in outputs).to_dict()
