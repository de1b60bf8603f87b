"""``--tool-call-parser``: the tool calls a model writes in its text, parsed into OpenAI tool calls, whole
(``ToolCallFormat.parse``) and while streaming (``ToolCallStream``), for the formats that vLLM's and SGLang's
parsers of these names read (each format's source is cited at its class).

Every format is read as one grammar. The output is content until ``start`` opens a section of tool calls; in
the section, each call after the first follows a ``separator``, and the section ends at the format's ``end``
(where it has one; the text after it is content again, and a later ``start`` opens another section), at the
end of the output (white space left after the last call is dropped), or at text that continues neither,
which is content again. White space may sit between these parts. A call is emitted whole once its end is
seen. A call that does not parse ends the parsing: the text from the end of the call before it (or from the
section's ``start``) to the end of the output is content, unchanged (vLLM's rule of never losing text). The
calls before it stay: there vLLM would return the whole output as content, but a stream cannot take back the
calls it has sent, and ``parse`` answers as the stream does.

Names must look like names (no white space, quotes, braces or angle brackets: vLLM's qwen3_coder check,
applied to every format), and arguments must be a JSON object; arguments the model wrote as JSON text are
kept as written (vLLM passes them on), those inside a JSON call or in a syntax of the model's own (gemma4)
are written out as JSON (``ensure_ascii`` off, as vLLM does).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object ("{}" when none)
    id: str | None = None  # the format's own id (kimi_k2); None: the server makes one


class _Malformed(Exception):
    """The text where a call should be is not one."""


# Kimi-K2's tool-call section markers, plural and singular (``_KimiK2``; server/reasoning.py ends a thinking block at
# either opener)
KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
KIMI_SECTION_SINGULAR = ("<|tool_call_section_begin|>", "<|tool_call_section_end|>")
_WS = re.compile(r"\s*")
_NAME = re.compile(r"[^\s{}<>\"']+")
_DECODER = json.JSONDecoder()


def _call(name: Any, arguments: str, call_id: str | None = None) -> ToolCall:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _Malformed
    return ToolCall(name, arguments, call_id)


def _raw_arguments(text: str) -> str:
    """Arguments the model wrote as JSON text, kept as written once known to be an object."""
    text = text.strip()
    try:
        is_object = isinstance(json.loads(text), dict)
    except ValueError:
        is_object = False
    if not is_object:
        raise _Malformed
    return text


def _json_call(obj: Any, keys: tuple[str, ...], default: dict | None = None) -> ToolCall:
    """A call written as a JSON object: its "name", its arguments under the first of ``keys`` it has."""
    if not isinstance(obj, dict):
        raise _Malformed
    arguments = next((obj[k] for k in keys if k in obj), default)
    if not isinstance(arguments, dict):
        raise _Malformed
    return _call(obj.get("name"), json.dumps(arguments, ensure_ascii=False))


def _json_at(text: str, pos: int, final: bool) -> tuple[Any, int] | None:
    """The JSON object or array at ``pos`` (after white space) and the position after it; None: not complete
    yet. Once complete it stays so (its closing bracket ends it), whatever text follows."""
    pos = _WS.match(text, pos).end()
    if pos == len(text) and not final:
        return None
    if not text.startswith(("{", "["), pos):
        raise _Malformed
    if not final and text.find("}" if text[pos] == "{" else "]", pos) < 0:
        return None  # cannot be complete: spare the decoder
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        if final:
            raise _Malformed from None
        return None


def _after(text: str, pos: int, marker: str, final: bool) -> int | None:
    """The position after ``marker``, which must be at ``pos``; None: the text so far only begins it."""
    if text.startswith(marker, pos):
        return pos + len(marker)
    if not final and marker.startswith(text[pos:]):
        return None
    raise _Malformed


def _delimited(
    text: str, pos: int, close: str, final: bool, parse: Callable[[str], ToolCall], open_ended=False
) -> tuple[list[ToolCall], int] | None:
    """``parse`` of the text from ``pos`` to the first ``close`` before which it parses (a ``close`` written
    inside a value cuts a body that does not parse), and the position after that ``close``; ``open_ended``:
    at the end of the output, a call without its ``close`` is the rest of the text."""
    i = text.find(close, pos)
    while i >= 0:
        try:
            return [parse(text[pos:i])], i + len(close)
        except _Malformed:
            i = text.find(close, i + 1)
    if not final:
        return None
    if open_ended:
        return [parse(text[pos:])], len(text)
    raise _Malformed


def _partial(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins one of ``markers`` (it may yet become that marker)."""
    longest = max(map(len, markers)) - 1
    for k in range(min(len(text), longest), 0, -1):
        if any(text.endswith(m[:k]) for m in markers if k < len(m)):
            return k
    return 0


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """Where the first of ``markers`` in ``text`` begins (-1: none), and which (at one place, the longest)."""
    found = [(i, -len(m), m) for m in markers if (i := text.find(m)) >= 0]
    if not found:
        return -1, ""
    at, _, marker = min(found)
    return at, marker


class ToolCallFormat:
    """A family's layout of tool calls: ``start`` opens a section, ``separator`` comes before each call after
    the first ("": calls follow one another), ``end`` closes the section ("": it has no closer);
    ``other_spellings``: more markers that open or close a section as ``start`` or ``end`` do (any opener with
    any closer); ``bare_start``: a character that also opens a section where the output begins with it (it
    belongs to the first call). Subclasses read one call (``_call``)."""

    name: str
    start: str
    separator = ""
    end = ""
    other_spellings: tuple[tuple[str, str], ...] = ()  # (opener, closer)
    bare_start = ""

    @property
    def starts(self) -> tuple[str, ...]:
        return (self.start, *(opener for opener, _ in self.other_spellings))

    @property
    def ends(self) -> tuple[str, ...]:
        return (self.end, *(closer for _, closer in self.other_spellings)) if self.end else ()

    def parse(self, text: str, tools: list[dict] | None) -> tuple[str, list[ToolCall]]:
        """Whole output -> (content outside the tool-call section(s), calls); text that does not parse as calls
        stays in the content, unchanged."""
        return ToolCallStream(self, tools).feed(text, final=True)

    def _call(
        self, text: str, pos: int, final: bool, tools: list[dict] | None
    ) -> tuple[list[ToolCall], int] | None:
        """The call(s) whose text begins at ``pos`` and the position after them; None (only before ``final``):
        not known yet. Raises ``_Malformed`` where no call is. What it answers before ``final`` holds for
        every text that continues ``text``, which is what makes a stream's answers those of ``parse``."""
        raise NotImplementedError


class _Hermes(ToolCallFormat):
    """Qwen2.5/Qwen3/QwQ: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block a call;
    the last block may lack its ``</tool_call>``. Source: vllm/tool_parsers/hermes_tool_parser.py."""

    name, start, separator = "hermes", "<tool_call>", "<tool_call>"

    def _call(self, text, pos, final, tools):
        found = _json_at(text, pos, final)
        if found is None:
            return None
        obj, pos = found
        call = _json_call(obj, ("arguments",))
        pos = _WS.match(text, pos).end()
        end = pos if final and pos == len(text) else _after(text, pos, "</tool_call>", final)
        return None if end is None else ([call], end)


class _Qwen3Coder(ToolCallFormat):
    """Qwen3-Coder/Qwen3.5: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...
    </function>\\n</tool_call>``; one newline at each end of a value is dropped, a value is text converted by
    its parameter's schema type (``_convert``); the last block may lack its ``</tool_call>``, a block its
    ``</function>``. Source: vllm/tool_parsers/qwen3coder_tool_parser.py (and SGLang's
    srt/function_call/qwen3_coder_detector.py)."""

    name, start, separator = "qwen3_coder", "<tool_call>", "<tool_call>"
    _FUNCTION = re.compile(r"\s*<function=([^>\n]*)>(.*?)(?:</function>\s*)?", re.S)
    # a value ends at a </parameter> followed by the next parameter or the function's end
    _PARAMETER = re.compile(
        r"\s*<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>(?=\s*(?:<parameter=|\Z))", re.S
    )

    def _call(self, text, pos, final, tools):
        parse = lambda body: self._function(body, tools)
        return _delimited(text, pos, "</tool_call>", final, parse, open_ended=True)

    def _function(self, body: str, tools: list[dict] | None) -> ToolCall:
        function = self._FUNCTION.fullmatch(body)
        if function is None:
            raise _Malformed
        name, params = function.groups()
        schemas = _properties(tools, name)
        arguments, pos = {}, 0
        while param := self._PARAMETER.match(params, pos):
            arguments[param[1]] = _convert(param[2], schemas.get(param[1]))
            pos = param.end()
        if params[pos:].strip():
            raise _Malformed
        return _call(name, json.dumps(arguments, ensure_ascii=False))


class _Step3p5(_Qwen3Coder):
    """Step-3.5-Flash writes Qwen3-Coder's calls (``<tool_call>``, ``<function=NAME>``, ``<parameter=P>``).
    Source: vllm/tool_parsers/step3p5_tool_parser.py."""

    name = "step3p5"


def _properties(tools: list[dict] | None, name: str) -> dict:
    """The JSON schemas of the parameters of the tool ``name`` in a request's ``tools``."""
    for tool in tools or ():
        function = tool.get("function") or {}
        if function.get("name") == name:
            return (function.get("parameters") or {}).get("properties") or {}
    return {}


def _convert(value: str, schema: Any) -> Any:
    """A qwen3_coder parameter's text as its schema's type has it: a string (or a parameter the schema lacks)
    as written; otherwise null/None (any case) is null, true/false (any case) a boolean's value, and text that
    parses as JSON its value, else the text. vLLM's and SGLang's own conversions differ in small ways (Python
    literals, integral floats, a bad boolean taken as false)."""
    kind = _schema_type(schema)
    if kind == "string":
        return value
    word = value.lower()
    if word in ("null", "none"):
        return None
    if kind == "boolean" and word in ("true", "false"):
        return word == "true"
    try:
        return json.loads(value)
    except ValueError:
        return value


def _schema_type(schema: Any) -> str:
    """The first type other than "null" of a property's schema ("type", a list of them, or "anyOf" of
    schemas with one, as vLLM reads it); "string" where it names none."""
    if not isinstance(schema, dict):
        return "string"
    kinds = schema.get("type") or [
        s.get("type") for s in schema.get("anyOf", ()) if isinstance(s, dict)
    ]
    if isinstance(kinds, str):
        kinds = [kinds]
    return next((k.lower() for k in kinds if isinstance(k, str) and k.lower() != "null"), "string")


class _Marked(ToolCallFormat):
    """A section of calls each between ``call_begin`` and ``call_end`` (markers), read by ``_body``."""

    call_begin: str
    call_end: str

    def _call(self, text, pos, final, tools):
        begin = _after(text, _WS.match(text, pos).end(), self.call_begin, final)
        return None if begin is None else _delimited(text, begin, self.call_end, final, self._body)

    def _body(self, body: str) -> ToolCall:
        raise NotImplementedError


class _DeepSeek(_Marked):
    start, end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    call_begin, call_end = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    _BODY: re.Pattern[str]  # groups "name" and "arguments"

    def _body(self, body):
        found = self._BODY.fullmatch(body)
        if found is None:
            raise _Malformed
        return _call(found["name"].strip(), _raw_arguments(found["arguments"]))


class _DeepSeekV3(_DeepSeek):
    """DeepSeek-V3/R1: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``
    in ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`` (the type before the separator is not read).
    Source: vllm/tool_parsers/deepseekv3_tool_parser.py, sglang/srt/function_call/deepseekv3_detector.py."""

    name = "deepseek_v3"
    _BODY = re.compile(
        r"[^\n]*?<｜tool▁sep｜>(?P<name>[^\n]*)\n```json\n(?P<arguments>.*)\n```", re.S
    )


class _DeepSeekV31(_DeepSeek):
    """DeepSeek-V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`` in the same section.
    Source: vllm/tool_parsers/deepseekv31_tool_parser.py, sglang/srt/function_call/deepseekv31_detector.py."""

    name = "deepseek_v31"
    _BODY = re.compile(r"(?P<name>[^\n]*?)<｜tool▁sep｜>(?P<arguments>.*)", re.S)


class _KimiK2(_Marked):
    """Kimi-K2: ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`` in
    ``<|tool_calls_section_begin|>...<|tool_calls_section_end|>``, or the section markers' singular spellings
    (``<|tool_call_section_begin|>``, ``..._end|>``: the K2 report's template; vLLM's parser reads both); the call's
    id is ``functions.NAME:IDX``, its name what follows the last dot before the colon. Source:
    vllm/tool_parsers/kimi_k2_tool_parser.py (``_SECTION_BEGIN_VARIANTS``, ``_SECTION_END_VARIANTS``)."""

    name = "kimi_k2"
    start, end = KIMI_SECTION
    other_spellings = (KIMI_SECTION_SINGULAR,)
    call_begin, call_end = "<|tool_call_begin|>", "<|tool_call_end|>"
    _BODY = re.compile(
        r"\s*(?P<id>[^<]+:\d+)\s*<\|tool_call_argument_begin\|>(?P<arguments>.*)", re.S
    )

    def _body(self, body):
        found = self._BODY.fullmatch(body)
        if found is None:
            raise _Malformed
        call_id = found["id"].strip()
        name = call_id.split(":")[0].split(".")[-1]
        return _call(name, _raw_arguments(found["arguments"]), call_id)


class _Mistral(ToolCallFormat):
    """Mistral: ``[TOOL_CALLS]`` and a JSON list of {"name", "arguments"} (templates before tokenizer v11;
    "arguments" may be left out), or ``[TOOL_CALLS]NAME[ARGS]{...}`` a call (v11 and later; ``[ARGS]`` is a
    token some tokenizers leave out of the text). Source: vllm/tool_parsers/mistral_tool_parser.py (and SGLang's
    srt/function_call/mistral_detector.py for ``[ARGS]``)."""

    name, start, separator = "mistral", "[TOOL_CALLS]", "[TOOL_CALLS]"

    def _call(self, text, pos, final, tools):
        pos = _WS.match(text, pos).end()
        if text.startswith("[", pos):
            found = _json_at(text, pos, final)
            if found is None:
                return None
            calls, end = found
            if not isinstance(calls, list) or not calls:
                raise _Malformed
            return [_json_call(c, ("arguments",), {}) for c in calls], end
        brace = text.find("{", pos)
        found = _json_at(text, brace, final) if brace >= 0 else None
        if found is None:
            if final:
                raise _Malformed
            return None
        arguments, end = found
        if not isinstance(arguments, dict):
            raise _Malformed
        name = text[pos:brace].replace("[ARGS]", "").strip()
        return [_call(name, text[brace:end])], end


class _Llama3Json(ToolCallFormat):
    """Llama 3.1/3.2: ``{"name": ..., "parameters": {...}}`` (or "arguments"), calls separated by ``;``, after
    ``<|python_tag|>`` or opening the output. Source: vllm/tool_parsers/llama_tool_parser.py (its stream's
    reading: a call opens the output), sglang/srt/function_call/llama32_detector.py (``<|python_tag|>`` after
    content)."""

    name, start, separator, bare_start = "llama3_json", "<|python_tag|>", ";", "{"

    def _call(self, text, pos, final, tools):
        found = _json_at(text, pos, final)
        if found is None:
            return None
        obj, end = found
        return [_json_call(obj, ("arguments", "parameters"))], end


class _Gemma4(_Marked):
    """Gemma 4: ``<|tool_call>call:NAME{ARGS}<tool_call|>`` a call, calls written one after another (no
    separator, no section closer). ARGS is Gemma's own syntax, not JSON (the chat template's ``format_argument``):
    ``key:value`` pairs joined by commas, keys bare (or wrapped as strings are), strings wrapped in ``<|"|>`` and
    written as they are (no escapes: a string ends at the next ``<|"|>``), objects in ``{...}``, lists of values
    in ``[...]`` joined by commas, white space between the parts ignored; a bare value is ``true``/``false``,
    null (``null``/``none``/``nil``, any case), a number, or else a string as written (vLLM's reading). The
    arguments are written out as a JSON object. What vLLM reads only by guessing is malformed here: a string,
    object or list left open, an empty value, a stray comma, JSON's quotes in a bare key or value.
    Source: vllm/tool_parsers/gemma4_tool_parser.py (``_parse_gemma4_args``; gemma4_utils.py is an offline
    reader), vLLM's examples/tool_chat_template_gemma4.jinja, SGLang's srt/function_call/gemma4_detector.py."""

    name, start, separator = "gemma4", "<|tool_call>", "<|tool_call>"
    call_begin, call_end = "call:", "<tool_call|>"

    def _body(self, body):
        brace = body.find("{")
        if brace < 0:
            raise _Malformed
        try:
            arguments, end = _gemma4_items(body, brace + 1, "}", _gemma4_pair)
        except RecursionError:  # nested past Python's stack
            raise _Malformed from None
        if body[end:].strip():
            raise _Malformed
        return _call(body[:brace], json.dumps(dict(arguments), ensure_ascii=False))


_G4_QUOTE = '<|"|>'  # Gemma 4's string delimiter (a special token)
_G4_KEY = re.compile(r'[^:,{}\[\]<>"]+')  # a bare key: up to its ":"
_G4_BARE = re.compile(r'[^,{}\[\]<>"]+')  # a bare value: up to the "," or closer after it
_G4_NUMBER = re.compile(r"-?(?:[0-9]+(\.[0-9]*)?|(\.)[0-9]+)([eE][-+]?[0-9]+)?")


def _gemma4_items(text: str, pos: int, close: str, item: Callable) -> tuple[list, int]:
    """The ``item``s from ``pos`` (after an opening bracket) joined by commas up to ``close``, and the position
    after it."""
    items: list = []
    pos = _WS.match(text, pos).end()
    if text.startswith(close, pos):
        return items, pos + 1
    while True:
        value, pos = item(text, pos)
        items.append(value)
        pos = _WS.match(text, pos).end()
        if text.startswith(close, pos):
            return items, pos + 1
        if not text.startswith(",", pos):
            raise _Malformed
        pos += 1


def _gemma4_string(text: str, pos: int) -> tuple[str, int] | None:
    """The ``<|"|>``-wrapped string at ``pos`` and the position after it; None: no string opens there."""
    if not text.startswith(_G4_QUOTE, pos):
        return None
    pos += len(_G4_QUOTE)
    end = text.find(_G4_QUOTE, pos)
    if end < 0:
        raise _Malformed
    return text[pos:end], end + len(_G4_QUOTE)


def _gemma4_pair(text: str, pos: int) -> tuple[tuple[str, Any], int]:
    pos = _WS.match(text, pos).end()
    found = _gemma4_string(text, pos)
    if found is None:
        word = _G4_KEY.match(text, pos)
        if word is None:
            raise _Malformed
        found = word[0].strip(), word.end()
    key, pos = found
    pos = _WS.match(text, pos).end()
    if not text.startswith(":", pos):
        raise _Malformed
    value, pos = _gemma4_value(text, pos + 1)
    return (key, value), pos


def _gemma4_value(text: str, pos: int) -> tuple[Any, int]:
    pos = _WS.match(text, pos).end()
    found = _gemma4_string(text, pos)
    if found is not None:
        return found
    if text.startswith("{", pos):
        pairs, pos = _gemma4_items(text, pos + 1, "}", _gemma4_pair)
        return dict(pairs), pos
    if text.startswith("[", pos):
        return _gemma4_items(text, pos + 1, "]", _gemma4_value)
    word = _G4_BARE.match(text, pos)
    if word is None:
        raise _Malformed
    return _gemma4_scalar(word[0].strip()), word.end()


def _gemma4_scalar(word: str) -> Any:
    """A bare value: a boolean, null, a number (an int where written without a point or exponent), or else the
    string as written."""
    if word in ("true", "false"):
        return word == "true"
    if word.lower() in ("null", "none", "nil"):
        return None
    number = _G4_NUMBER.fullmatch(word)
    if number is not None:
        if not any(number.groups()):
            return int(word)
        if math.isfinite(value := float(word)):
            return value
    return word


TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {
    f.name: f
    for f in (
        _Hermes(),
        _Qwen3Coder(),
        _Step3p5(),
        _DeepSeekV3(),
        _DeepSeekV31(),
        _KimiK2(),
        _Mistral(),
        _Llama3Json(),
        _Gemma4(),
    )
}


def tool_call_format(name: str) -> ToolCallFormat:
    """The format of ``--tool-call-parser NAME`` (vLLM's names)."""
    found = TOOL_CALL_FORMATS.get(name)
    if found is None:
        known = ", ".join(sorted(TOOL_CALL_FORMATS))
        raise ValueError(f"--tool-call-parser {name!r} is not known (one of: {known})")
    return found


_CONTENT, _CALL, _NEXT, _PASS = range(4)  # ToolCallStream's modes


class ToolCallStream:
    """One streamed choice: fed the text deltas as they come, returns what may be sent now. Content passes as
    it comes except a tail that could begin ``start`` (held back until known not to); from ``start`` on, text
    waits until the call it holds is complete, and each call is emitted whole (at ``final`` where only the end
    of the output completes it). Concatenated, the content and calls are what ``parse`` gives the whole text.

    ``text`` holds what was received and is neither sent nor consumed; its mode says what it begins with:
    content (``_CONTENT``), a call at ``call_at`` (``_CALL``: its ``start`` or separator before), what follows a
    call (``_NEXT``), or content to the end since a call did not parse (``_PASS``)."""

    def __init__(self, fmt: ToolCallFormat, tools: list[dict] | None) -> None:
        self.fmt, self.tools = fmt, tools
        self.text, self.mode, self.call_at = "", _CONTENT, 0
        self.begun = False  # some text was received (a bare_start opens only the output)

    def feed(self, delta: str, final: bool) -> tuple[str, list[ToolCall]]:
        self.text += delta
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._step(final, content, calls):
            pass
        return "".join(content), calls

    def _step(self, final: bool, content: list[str], calls: list[ToolCall]) -> bool:
        """Moves on by what ``text`` decides; False: nothing more until more text comes (or at the end)."""
        fmt, text = self.fmt, self.text
        if self.mode == _CONTENT:
            if fmt.bare_start and not self.begun:
                if not text and not final:
                    return False
                self.begun = True
                if text.startswith(fmt.bare_start):
                    self.mode, self.call_at = _CALL, 0
                    return True
            i, opener = _first(text, fmt.starts)
            if i >= 0:
                self.mode, self.call_at = _CALL, len(opener)
            else:
                i = len(text) - (0 if final else _partial(text, fmt.starts))
            content.append(text[:i])
            self.text = text[i:]
            return self.mode == _CALL
        if self.mode == _CALL:
            try:
                found = fmt._call(text, self.call_at, final, self.tools)
            except _Malformed:
                self.mode = _PASS
                return True
            if found is None:
                return False
            new, end = found
            calls += new
            self.text, self.mode = text[end:], _NEXT
            return True
        if self.mode == _NEXT:
            pos = _WS.match(text).end()
            rest = text[pos:]
            closer = next((m for m in fmt.ends if rest.startswith(m)), None)
            if closer is not None:
                self.text, self.mode = rest[len(closer) :], _CONTENT
            elif not rest:
                if final:
                    self.text = ""
                return False
            elif fmt.separator and rest.startswith(fmt.separator):
                self.mode, self.call_at = _CALL, pos + len(fmt.separator)
            elif not final and any(m.startswith(rest) for m in (fmt.separator, *fmt.ends) if m):
                return False
            elif not fmt.separator:
                self.mode, self.call_at = _CALL, pos
            else:
                self.mode = _CONTENT
            return True
        content.append(text)
        self.text = ""
        return False
