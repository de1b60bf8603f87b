"""Chat messages as a chat template reads them: the one preparation that ``LLM.chat`` (engine/llm.py) and the
server (server/protocol.py ``conversation``) share. Plain dicts in and out, so the offline API needs no pydantic.

What changes (OpenAI's message shape -> what Hugging Face templates expect, as vLLM prepares it in
vllm/entrypoints/chat_utils.py ``parse_chat_messages`` and ``_postprocess_messages``):
- the role ``developer`` (OpenAI's new name for system) becomes ``system``;
- content: OpenAI's text parts joined into one string, None (or absent) as ""; any other part is refused;
- an assistant's ``tool_calls``: each call's ``function.arguments`` JSON text becomes the object it encodes (the
  templates of Qwen, DeepSeek and Kimi render an object); an empty list is dropped;
- a field whose value is None is left out; the other fields pass as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_TEXT_PART = "{'type': 'text', 'text': str}"


class MessageError(ValueError):
    """A message the template cannot take. ``path`` locates the field within the list of messages
    (``(0, "content", 1)``: message 0's content part 1); the text names it in words (``message 0 content part 1``).
    ``code``: OpenAI's error code for it, where one applies."""

    def __init__(self, path: tuple[int | str, ...], message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.path, self.code = path, code

    @property
    def param(self) -> str:
        """The path dotted, as an OpenAI error's ``param`` writes it below ``messages``: ``0.content.1``."""
        return ".".join(map(str, self.path))


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (dicts with at least a ``role``) as the chat template reads them; see the module's docstring."""
    return [_template_message(i, m) for i, m in enumerate(messages)]


def _template_message(i: int, message: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in message.items() if value is not None}
    out["role"] = "system" if message["role"] == "developer" else message["role"]
    out["content"] = _content_text(i, message.get("content"))
    if "tool_calls" in out:
        calls = out.pop("tool_calls")
        if calls:
            out["tool_calls"] = [_template_call(i, j, call) for j, call in enumerate(calls)]
    return out


def _content_text(i: int, content: Any) -> str:
    """Message ``i``'s content as one string: a string, OpenAI's text parts joined, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not (isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray))):
        raise MessageError(
            (i, "content"),
            f"message {i}: content must be a string, a list of text parts or None, not a "
            f"{type(content).__name__}",
        )
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind != "text":
            raise MessageError(
                (i, "content", j),
                f"message {i} content part {j} ({kind!r}) is not supported: only {_TEXT_PART} parts",
                "unsupported_content",
            )
        if not isinstance(part.get("text"), str):
            raise MessageError(
                (i, "content", j, "text"),
                f"message {i} content part {j}: a content part of type 'text' needs a 'text' string",
            )
    return "".join(part["text"] for part in content)


def _template_call(i: int, j: int, call: Any) -> dict[str, Any]:
    """Message ``i``'s tool call ``j`` with its ``function.arguments`` as an object (JSON text is parsed; an object
    passes as it is)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        raise MessageError(
            (i, "tool_calls", j), f"message {i} tool call {j} needs a 'function' object"
        )
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise _arguments_error(i, j, f"is not JSON: {e}") from None
    if not isinstance(arguments, Mapping):
        raise _arguments_error(i, j, "is not a JSON object")
    return {**call, "function": {**function, "arguments": arguments}}


def _arguments_error(i: int, j: int, problem: str) -> MessageError:
    return MessageError(
        (i, "tool_calls", j, "function", "arguments"),
        f"message {i} tool call {j}: function.arguments {problem}",
    )
