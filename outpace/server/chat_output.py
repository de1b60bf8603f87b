"""What a chat choice's generated text becomes in the answer: ``content``, and with the server's parsers its
``reasoning_content`` (``--reasoning-parser``, server/reasoning.py) and ``tool_calls`` (``--tool-call-parser``,
server/tool_calls.py), for the whole message and for a stream's deltas.

The reasoning is split off first and the tool calls are parsed from what follows it, as SGLang and vLLM
chain their two parsers. A forced tool choice (``required`` or a named function) needs no parser: its output
is the JSON its constraint allows (server/protocol.py ``constraint_source``), read whole at the end (while
streaming too), and not split for reasoning, which the constraint leaves no room for. Other constraints
(``response_format``, ``structured_outputs``) hold after the thinking ends (``starts_after``, as vLLM applies
them once its reasoning parser sees the end), unless the prompt ended it.

A choice that stopped on its own after calls the model chose (tool_choice "auto", or "required": which tool,
and how many, were its to pick) ends with finish_reason "tool_calls"; the call of a named function was the
request's, not the model's, so that choice ends "stop" (OpenAI's answers, vLLM's since its PR #25054), whole
and streamed alike. A call's id is the format's own where it has one (Kimi-K2's), else ``call_`` and 24 hex
digits.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from outpace.server.protocol import ChatCompletionRequest, bad_request
from outpace.server.reasoning import ReasoningStream, ThinkingFormat
from outpace.server.tool_calls import ToolCall, ToolCallFormat, ToolCallStream


@dataclass(frozen=True)
class ChatParsers:
    """The server's parsers; ``special_markers``: a parser's markers are special tokens of the tokenizer, which
    the output's text must then keep (vLLM sets ``skip_special_tokens`` false for such parsers)."""

    reasoning: ThinkingFormat | None = None
    tools: ToolCallFormat | None = None
    special_markers: bool = False

    @classmethod
    def of(
        cls, reasoning: ThinkingFormat | None, tools: ToolCallFormat | None, tokenizer
    ) -> ChatParsers:
        markers = ([reasoning.start, reasoning.end] if reasoning else []) + (
            [tools.start] if tools else []
        )
        return cls(reasoning, tools, any(_is_special(tokenizer, m) for m in markers))

    def for_request(self, body: ChatCompletionRequest, prompt: str) -> ChatParsing:
        """How one request's choices are parsed; tools asked for without a parser are refused by name."""
        calls_tools, forced = body.calls_tools, body.forced_tool
        options = dict(
            include_reasoning=body.include_reasoning,
            stream_reasoning=body.stream_reasoning,
            max_calls=None if body.parallel_tool_calls is not False else 1,
        )
        if forced is not None:
            return ChatParsing(None, None, body.tool_dicts(), prompt, forced, **options)
        if calls_tools and self.tools is None:
            raise bad_request(
                'tool_choice "auto" (the default with tools) needs the server started with '
                "--tool-call-parser",
                "tool_choice",
            )
        if self.special_markers and (self.reasoning or calls_tools):
            body.skip_special_tokens = False
        if self.reasoning is not None and not self.reasoning.ended_in(prompt):
            body._starts_after = self.reasoning.end  # a constraint holds for the answer alone
        tools = self.tools if calls_tools else None
        reasoning = self.reasoning if body.separate_reasoning else None
        return ChatParsing(reasoning, tools, body.tool_dicts(), prompt, **options)


def _is_special(tokenizer, marker: str) -> bool:
    """Whether decoding without special tokens drops ``marker`` (it is one, or is made of them)."""
    if tokenizer is None:
        return False
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return marker not in tokenizer.decode(ids, skip_special_tokens=True)


@dataclass(frozen=True)
class ChatParsing:
    reasoning: ThinkingFormat | None
    tools: ToolCallFormat | None  # None: tool calls are not parsed
    tool_list: list[dict[str, Any]] | None
    prompt: str
    forced: str | None = None  # a forced tool choice: the function's name, or "required"
    include_reasoning: bool = True  # (vLLM's include_reasoning false: the thinking is dropped)
    stream_reasoning: bool = (
        True  # (SGLang's stream_reasoning false: the thinking in one delta at its end)
    )
    max_calls: int | None = None  # 1 with parallel_tool_calls false: the first call alone

    @property
    def parses(self) -> bool:
        return self.reasoning is not None or self.tools is not None or self.forced is not None

    def finish_reason(self, reason: str | None, num_calls: int) -> str | None:
        """The finish reason of a choice that ended for ``reason`` with ``num_calls`` calls: "tool_calls" where
        it stopped on its own after calls the model chose (not a named function's: module docstring)."""
        chose = num_calls > 0 and self.forced in (None, "required")
        return "tool_calls" if chose and reason == "stop" else reason

    def message(self, text: str) -> dict[str, Any]:
        """The assistant message of a finished choice's text."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.forced is not None:
            calls = self.forced_calls(text)
            if calls is None:  # (cut short: the text as it is)
                return message
            calls = calls[: self.max_calls]
            return {**message, "content": None, "tool_calls": [_call(c) for c in calls]}
        content: str | None = text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.split(
                text, self.reasoning.starts_inside(self.prompt)
            )
            if self.include_reasoning:
                message["reasoning_content"] = reasoning
        calls: list[ToolCall] = []
        if self.tools is not None and content:
            content, calls = self.tools.parse(content, self.tool_list)
            calls = calls[: self.max_calls]
        message["content"] = content or None
        if calls:
            message["tool_calls"] = [_call(c) for c in calls]
        return message

    def forced_calls(self, text: str) -> list[ToolCall] | None:
        """The calls of a forced tool choice's output (None: not whole JSON, e.g. cut off by max_tokens)."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        if self.forced != "required":
            return [ToolCall(self.forced, text)]
        return [ToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in value]

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """One streamed choice: text deltas in, the chat delta's fields out (``content``, ``reasoning_content``,
    ``tool_calls`` where each has something new)."""

    def __init__(self, parsing: ChatParsing) -> None:
        self.parsing, self.text = parsing, ""
        self.reasoning = (
            ReasoningStream(parsing.reasoning, parsing.prompt) if parsing.reasoning else None
        )
        self.tools = ToolCallStream(parsing.tools, parsing.tool_list) if parsing.tools else None
        self.num_calls = 0
        self.thinking = ""  # the thinking held back (stream_reasoning false)

    def feed(self, delta: str, final: bool) -> dict[str, Any]:
        if self.parsing.forced is not None:
            return self._forced(delta, final)
        fields: dict[str, Any] = {}
        content = delta
        if self.reasoning is not None:
            reasoning, content = self.reasoning.feed(delta, final)
            if not self.parsing.stream_reasoning:
                self.thinking += reasoning
                ended = final or self.reasoning.phase == "content"
                reasoning, self.thinking = (self.thinking, "") if ended else ("", self.thinking)
            if reasoning and self.parsing.include_reasoning:
                fields["reasoning_content"] = reasoning
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
            if self.parsing.max_calls is not None:
                calls = calls[: max(0, self.parsing.max_calls - self.num_calls)]
            if calls:
                fields["tool_calls"] = [
                    {"index": self.num_calls + k, **_call(c)} for k, c in enumerate(calls)
                ]
                self.num_calls += len(calls)
        if content:
            fields["content"] = content
        return fields

    def _forced(self, delta: str, final: bool) -> dict[str, Any]:
        """A forced tool choice's output, held until the end and then sent as its calls."""
        self.text += delta
        if not final:
            return {}
        message = self.parsing.message(self.text)
        calls = message.get("tool_calls", [])
        self.num_calls = len(calls)
        if not calls:
            return {"content": self.text} if self.text else {}
        return {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]}


def _call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
