"""Chat messages as a chat template reads them: the one preparation that ``LLM.chat`` (engine/llm.py) and the
server (server/protocol.py ``conversation``) share. Plain dicts in and out, so the offline API needs no pydantic.

What changes (OpenAI's message shape -> what Hugging Face templates expect, as vLLM prepares it in
vllm/entrypoints/chat_utils.py ``parse_chat_messages`` and ``_postprocess_messages``):
- the role ``developer`` (OpenAI's new name for system) becomes ``system``;
- content, in the template's content format (``content_format``, vLLM's ``--chat-template-content-format auto``):
  "string" (most templates): OpenAI's text parts joined into one string with newlines, None (or absent) as "";
  "openai" (a template that loops over ``message['content']``): a list of ``{'type': 'text', 'text': ...}`` parts,
  a string as one part, None as no part, but a tool's as one string (as vLLM normalizes a tool message's text
  parts: most templates read a tool's content as a string); a part other than text is refused;
- an assistant's ``tool_calls``: each call's ``function.arguments`` JSON text becomes the object it encodes (the
  templates of Qwen, DeepSeek and Kimi render an object); an empty list is dropped;
- a field whose value is None is left out; the other fields pass as they are.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import nodes

# Where transformers' AutoTokenizer (and so vLLM) finds a tokenizer's chat templates, for the refusal of a chat
# to a model without one (tokenization_utils_base.py ``from_pretrained``: the files before the config's field).
NO_TEMPLATE_FOUND = (
    "none in the tokenizer's chat_template.jinja, additional_chat_templates/ or tokenizer_config.json "
    "chat_template"
)
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


def template_messages(
    messages: Sequence[Mapping[str, Any]], content_format: str = "string"
) -> list[dict[str, Any]]:
    """``messages`` (dicts with at least a ``role``) as the chat template reads them, their content in
    ``content_format`` ("string" or "openai": ``content_format``); see the module's docstring."""
    return [_template_message(i, m, content_format) for i, m in enumerate(messages)]


def load_chat_template(value: str) -> str:
    """``--chat-template`` as vLLM takes it (vllm/entrypoints/chat_utils.py ``load_chat_template``): the text of
    the file it names, else, where it holds a Jinja character ("{", "}" or a newline), the template itself; a file
    it cannot open is named (vLLM's own templates, which it looks in too, are not here). The template must parse
    as transformers renders it."""
    try:
        with open(value, encoding="utf-8") as f:
            template = f.read()
    except OSError as e:
        if not any(c in value for c in "{}\n"):
            raise ValueError(
                f"--chat-template {value!r} is invalid: no such template file "
                f"({e.strerror or e}), nor a template (it has no '{{', '}}' or newline)"
            ) from None
        template = value
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(template)
    except Exception as e:  # noqa: BLE001 - jinja's TemplateSyntaxError
        raise ValueError(f"--chat-template {value!r} is not a valid chat template: {e}") from None
    return template


@functools.lru_cache(maxsize=32)  # (a template is parsed once, not at every chat)
def content_format(template: str) -> str:
    """The content format of ``template`` as vLLM detects it (vllm/entrypoints/chat_utils.py
    ``_detect_content_format``): "openai" where it loops over a message's content (``{% for part in
    message['content'] %}`` within ``{% for message in messages %}``, through ``{% set %}`` aliases too), so
    that it reads OpenAI's list of parts; else (and for a template that does not parse) "string"."""
    from jinja2 import nodes  # (with the template: jinja2 is what transformers renders it with)
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        root = _compile_jinja_template(template).environment.parse(template)
    except Exception:  # noqa: BLE001 - a template that does not parse fails, named, when it is applied
        return "string"
    loops = list(root.find_all(nodes.For))
    messages = _aliases(root, "messages")
    message_names = {
        loop.target.name
        for loop in loops
        if isinstance(loop.target, nodes.Name) and any(_reads(loop.iter, m) for m in messages)
    }
    return (
        "openai"
        if any(_reads(loop.iter, m, "content") for loop in loops for m in message_names)
        else "string"
    )


def _aliases(root: nodes.Node, name: str) -> list[str]:
    """``name`` and the variables that ``{% set %}`` assigns from it (or a slice or filter of it), transitively."""
    from jinja2 import nodes

    names, queue = [name], [name]
    while queue:
        source = queue.pop(0)
        for assign in root.find_all(nodes.Assign):
            target = assign.target
            if isinstance(target, nodes.Name) and _reads(assign.node, source):
                if target.name not in names:
                    names.append(target.name)
                    queue.append(target.name)
    return names


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """Whether ``node`` reads variable ``name`` (``key``: its item ``key``), through filters, tests and slices."""
    from jinja2 import nodes

    if isinstance(node, (nodes.Filter, nodes.Test)):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name
    if isinstance(node, nodes.Getitem):
        return (
            _reads(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
        )
    return isinstance(node, nodes.Getattr) and _reads(node.node, name) and node.attr == key


def _template_message(i: int, message: Mapping[str, Any], content_format: str) -> dict[str, Any]:
    out = {key: value for key, value in message.items() if value is not None}
    out["role"] = "system" if message["role"] == "developer" else message["role"]
    texts = _content_texts(i, message.get("content"))
    out["content"] = (
        [{"type": "text", "text": text} for text in texts]
        if content_format == "openai" and out["role"] != "tool"
        else "\n".join(texts)
    )
    if "tool_calls" in out:
        calls = out.pop("tool_calls")
        if calls:
            out["tool_calls"] = [_template_call(i, j, call) for j, call in enumerate(calls)]
    return out


def _content_texts(i: int, content: Any) -> list[str]:
    """Message ``i``'s content as its texts: a string's one, OpenAI's text parts' each, None's none."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
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
    return [part["text"] for part in content]


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
