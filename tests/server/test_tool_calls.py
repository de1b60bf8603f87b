"""``--tool-call-parser`` formats (server/tool_calls.py): outputs written in each family's public layout parse
into their calls and content; text that does not parse stays content, unchanged; and a stream, however its
text is split into deltas, gives what ``parse`` gives the whole text."""

import json
import random

import pytest

from outpace.server.tool_calls import (
    TOOL_CALL_FORMATS,
    ToolCall,
    ToolCallStream,
    tool_call_format,
)

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
KIMI_BEGIN, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filter": {"type": "object"},
                    "flag": {"type": "boolean"},
                    "count": {"type": "integer"},
                },
            },
        },
    }
]
WEATHER = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {})
# nested objects, unicode, escaped quotes and a backslash
SEARCH = (
    "search",
    {
        "query": 'naïve "café" in 東京 \\ ok',
        "filter": {"tags": ["a", "b"], "range": {"min": 1, "max": 2.5}},
        "flag": True,
        "count": 3,
    },
)


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def qwen3_coder_call(i, name, args):
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else dumps(v)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def gemma(value) -> str:
    """``value`` in Gemma 4's argument syntax (vLLM's tool_chat_template_gemma4.jinja ``format_argument``)."""
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(gemma, value)) + "]"
    return dumps(value)  # true, false, null, numbers


# each format: (the text of call number i, the calls' texts joined into the output's tool-call part)
LAYOUTS = {
    "hermes": (
        lambda i, n, a: f"<tool_call>\n{dumps({'name': n, 'arguments': a})}\n</tool_call>",
        "\n".join,
    ),
    "qwen3_coder": (qwen3_coder_call, "\n".join),
    "deepseek_v3": (
        lambda i, n, a: (
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{dumps(a)}\n```"
            "<｜tool▁call▁end｜>"
        ),
        lambda calls: DS_BEGIN + "\n".join(calls) + DS_END,
    ),
    "deepseek_v31": (
        lambda i, n, a: f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{dumps(a)}<｜tool▁call▁end｜>",
        lambda calls: DS_BEGIN + "".join(calls) + DS_END,
    ),
    "kimi_k2": (
        lambda i, n, a: (
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>"
            f"{dumps(a)}<|tool_call_end|>"
        ),
        lambda calls: KIMI_BEGIN + "".join(calls) + KIMI_END,
    ),
    "mistral": (lambda i, n, a: f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}", "".join),
    "llama3_json": (
        lambda i, n, a: dumps({"name": n, "parameters": a}),
        lambda calls: "<|python_tag|>" + "; ".join(calls),
    ),
    "gemma4": (lambda i, n, a: f"<|tool_call>call:{n}{gemma(a)}<tool_call|>", "".join),
}


def tool_text(fmt: str, *calls) -> str:
    render, join = LAYOUTS[fmt]
    return join([render(i, n, a) for i, (n, a) in enumerate(calls)])


def expected(fmt: str, *calls) -> list[ToolCall]:
    ids = [f"functions.{n}:{i}" if fmt == "kimi_k2" else None for i, (n, _) in enumerate(calls)]
    return [ToolCall(n, dumps(a), i) for (n, a), i in zip(calls, ids)]


def parse(fmt: str, text: str):
    return tool_call_format(fmt).parse(text, TOOLS)


# the cases of every format: (text, content, calls)
def cases(fmt: str):
    yield tool_text(fmt, WEATHER), "", expected(fmt, WEATHER)
    yield tool_text(fmt, WEATHER, TIME), "", expected(fmt, WEATHER, TIME)
    yield "Let me check.\n\n" + tool_text(fmt, WEATHER), "Let me check.\n\n", expected(fmt, WEATHER)
    yield tool_text(fmt, SEARCH, WEATHER), "", expected(fmt, SEARCH, WEATHER)
    for text in ("It is sunny in Paris.", "", "a < b and [1] {x} <tool", "tags: <|python"):
        yield text, text, []


LAYOUTS["step3p5"] = LAYOUTS["qwen3_coder"]  # (Step-3.5-Flash writes Qwen3-Coder's calls)

MALFORMED = {
    "hermes": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": "get weather", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call',
        "I would write <tool_call> here.",
    ],
    "qwen3_coder": [
        "<tool_call>\nno function here\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\nstray text\n</function>\n</tool_call>",
    ],
    "deepseek_v3": [
        DS_BEGIN
        + '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": }\n```'
        "<｜tool▁call▁end｜>" + DS_END,
        DS_BEGIN
        + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{}<｜tool▁call▁end｜>"
        + DS_END,
        DS_BEGIN + "get_weather" + DS_END,
    ],
    "deepseek_v31": [
        DS_BEGIN
        + '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"<｜tool▁call▁end｜>'
        + DS_END,
        DS_BEGIN
        + "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[1, 2]<｜tool▁call▁end｜>"
        + DS_END,
        DS_BEGIN + '<｜tool▁call▁begin｜>get_weather{"city": "Paris"}<｜tool▁call▁end｜>' + DS_END,
    ],
    "kimi_k2": [
        KIMI_BEGIN + "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": Paris}<|tool_call_end|>' + KIMI_END,
        KIMI_BEGIN + "<|tool_call_begin|>functions.get_weather<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|>' + KIMI_END,
        KIMI_BEGIN + "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}',
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}]',
        "[TOOL_CALLS][]",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"',
        "[TOOL_CALLS]get_weather",
        '[TOOL_CALLS]what is the weather {"city": "Paris"}',
    ],
    "llama3_json": [
        '{"name": "get_weather", "parameters": {"city": "Paris"}',
        '{"answer": 42}',
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        '{"name": "get_weather"}',
    ],
    "gemma4": [
        '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>',  # vLLM: "Paris"
        '<|tool_call>get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        "<|tool_call>call:get weather{}<tool_call|>",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}',
        '<|tool_call>call:get_weather{"city": "Paris"}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,,days:3}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|> days:3}<tool_call|>',
        '<|tool_call>call:get_weather{city:[<|"|>Paris<|"|>}<tool_call|>',
        '<|tool_call>call:get_weather{city:{name:<|"|>Paris<|"|>}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>} then<tool_call|>',
        "<|tool_call>call:get_weather<tool_call|>",
        "I would write <|tool_call> here.",
    ],
}
MALFORMED["step3p5"] = MALFORMED["qwen3_coder"]


def all_cases():
    for fmt in TOOL_CALL_FORMATS:
        for text, content, calls in cases(fmt):
            yield fmt, text, content, calls
        for text in MALFORMED[fmt]:
            yield fmt, text, text, []


def test_every_format_is_covered():
    assert set(TOOL_CALL_FORMATS) == set(LAYOUTS) == set(MALFORMED)
    assert set(TOOL_CALL_FORMATS) == {
        "hermes",
        "qwen3_coder",
        "step3p5",
        "deepseek_v3",
        "deepseek_v31",
        "kimi_k2",
        "mistral",
        "llama3_json",
        "gemma4",
    }


@pytest.mark.parametrize("fmt, text, content, calls", list(all_cases()))
def test_parse(fmt, text, content, calls):
    assert parse(fmt, text) == (content, calls)


@pytest.mark.parametrize("fmt", sorted(TOOL_CALL_FORMATS))
def test_content_after_the_calls_stays(fmt):
    text = "Before." + tool_text(fmt, WEATHER) + "\n\nAfter."
    assert parse(fmt, text) == ("Before.\n\nAfter.", expected(fmt, WEATHER))
    # white space after the last call is dropped; after a section's closer it is content
    text = "Before." + tool_text(fmt, WEATHER) + " \n"
    content = "Before. \n" if tool_call_format(fmt).end else "Before."
    assert parse(fmt, text) == (content, expected(fmt, WEATHER))


@pytest.mark.parametrize("fmt", sorted(TOOL_CALL_FORMATS))
def test_a_bad_call_after_good_ones_is_content(fmt):
    """The calls before it stay (a stream has sent them); its text and all after it are content."""
    good, [bad, *_] = tool_text(fmt, WEATHER), MALFORMED[fmt]
    if fmt in ("deepseek_v3", "deepseek_v31", "kimi_k2"):  # one section: the bad call inside it
        begin, end = (KIMI_BEGIN, KIMI_END) if fmt == "kimi_k2" else (DS_BEGIN, DS_END)
        text = good.removesuffix(end) + bad.removeprefix(begin)
        rest = bad.removeprefix(begin)
    else:
        sep = {"mistral": "", "llama3_json": "; "}.get(fmt, "\n")
        text, rest = good + sep + bad, sep + bad
    assert parse(fmt, text) == (rest, expected(fmt, WEATHER))


def test_arguments_written_as_json_text_are_kept_as_written():
    args = '{"q":"東京",  "n": [1,2]}'
    text = f"{DS_BEGIN}<｜tool▁call▁begin｜>search<｜tool▁sep｜>{args}<｜tool▁call▁end｜>{DS_END}"
    assert parse("deepseek_v31", text)[1] == [ToolCall("search", args)]
    text = f"[TOOL_CALLS]search[ARGS]{args}"
    assert parse("mistral", text)[1] == [ToolCall("search", args)]
    text = '<tool_call>\n{"name": "search", "arguments": ' + args + "}\n</tool_call>"
    assert parse("hermes", text)[1] == [ToolCall("search", '{"q": "東京", "n": [1, 2]}')]


def test_hermes_end_tag_inside_a_string_and_a_last_call_without_its_end():
    args = {"html": "<tool_call>x</tool_call>"}
    text = f"<tool_call>\n{dumps({'name': 'render', 'arguments': args})}\n</tool_call>"
    assert parse("hermes", text) == ("", [ToolCall("render", dumps(args))])
    text = (
        '<tool_call>\n{"name": "get_time", "arguments": {}}'  # vLLM: "<tool_call>(.*)" at the end
    )
    assert parse("hermes", text) == ("", [ToolCall("get_time", "{}")])


def test_qwen3_coder_values_take_their_schema_types():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "s": {"type": "string"},
                        "i": {"type": "integer"},
                        "bad_i": {"type": "integer"},
                        "x": {"type": "number"},
                        "b": {"type": "boolean"},
                        "o": {"type": "object"},
                        "a": {"type": "array"},
                        "n": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
                        "sn": {"type": ["string", "null"]},
                        "untyped": {"description": "no type"},
                    },
                },
            },
        }
    ]
    values = {
        "s": "42",
        "i": "7",
        "bad_i": "seven",
        "x": "2.5",
        "b": "True",
        "o": '{"k": ["v", 1]}',
        "a": "[1, 2]",
        "n": "null",
        "sn": "null",
        "untyped": "3",
        "unknown": "4",
        "code": 'if a < b:\n    print("</parameter>")\n',
    }
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    text = f"<tool_call>\n<function=f>\n{params}</function>\n</tool_call>"
    content, [call] = TOOL_CALL_FORMATS["qwen3_coder"].parse(text, tools)
    assert (content, call.name, call.id) == ("", "f", None)
    assert json.loads(call.arguments) == {
        "s": "42",
        "i": 7,
        "bad_i": "seven",
        "x": 2.5,
        "b": True,
        "o": {"k": ["v", 1]},
        "a": [1, 2],
        "n": None,
        "sn": "null",
        "untyped": "3",
        "unknown": "4",
        "code": 'if a < b:\n    print("</parameter>")\n',
    }
    # without the tools every value is a string; no parameters: "{}"
    [call] = TOOL_CALL_FORMATS["qwen3_coder"].parse(text, None)[1]
    assert json.loads(call.arguments) == values
    text = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
    assert parse("qwen3_coder", text) == ("", [ToolCall("get_time", "{}")])


def test_qwen3_coder_end_tag_inside_a_value_and_a_last_call_without_its_end():
    code = 'print("</tool_call>")'
    text = f"<tool_call>\n<function=run>\n<parameter=code>\n{code}\n</parameter>\n</function>\n"
    text += "</tool_call>"
    assert parse("qwen3_coder", text) == ("", [ToolCall("run", dumps({"code": code}))])
    text = "<tool_call>\n<function=run>\n<parameter=code>\nls\n</parameter>\n</function>"
    assert parse("qwen3_coder", text) == ("", [ToolCall("run", '{"code": "ls"}')])


def test_kimi_k2_ids_are_the_models():
    text = (
        KIMI_BEGIN + "<|tool_call_begin|> functions.get_weather:3 <|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|>' + "<|tool_call_begin|>get_time:4"
        "<|tool_call_argument_begin|>{}<|tool_call_end|>" + KIMI_END
    )
    assert parse("kimi_k2", text) == (
        "",
        [
            ToolCall("get_weather", '{"city": "Paris"}', "functions.get_weather:3"),
            ToolCall("get_time", "{}", "get_time:4"),
        ],
    )


def test_kimi_k2_reads_the_singular_section_markers_too():
    """The K2 report's template spells the section markers ``<|tool_call_section_begin|>`` / ``..._end|>`` (vLLM's
    parser reads both spellings): the same calls, whole and however the text streams, and either closer ends a
    section."""
    plural = "Sure." + tool_text("kimi_k2", WEATHER, TIME) + " Done."
    singular = plural.replace("tool_calls_section", "tool_call_section")
    mixed = plural.replace("tool_calls_section_begin", "tool_call_section_begin")
    want = ("Sure. Done.", expected("kimi_k2", WEATHER, TIME))
    rng = random.Random(7)
    for text in (plural, singular, mixed):
        assert parse("kimi_k2", text) == want, text
        assert streamed("kimi_k2", list(text) + [""]) == want, text
        for _ in range(30):
            assert streamed("kimi_k2", split(text, rng)) == want, text
    # a tail that may begin either opener is held back until it cannot
    stream = ToolCallStream(tool_call_format("kimi_k2"), TOOLS)
    assert stream.feed("Hi <|tool_call_sec", False) == ("Hi ", [])
    assert stream.feed("ond", False) == ("<|tool_call_second", [])


def test_mistral_json_list_and_name_without_args_token():
    calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time"}]
    text = "Sure. [TOOL_CALLS] " + dumps(calls)
    assert parse("mistral", text) == ("Sure. ", expected("mistral", WEATHER, TIME))
    text = '[TOOL_CALLS]get_weather{"city": "Paris"}'  # the [ARGS] token decoded away
    assert parse("mistral", text) == ("", expected("mistral", WEATHER))


def test_llama3_json_bare_json_opens_only_the_output():
    calls = '{"name": "get_weather", "arguments": {"city": "Paris"}};'
    calls += '{"name": "get_time", "parameters": {}}'
    assert parse("llama3_json", calls) == ("", expected("llama3_json", WEATHER, TIME))
    text = 'Here: {"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert parse("llama3_json", text) == (text, [])
    text = " " + calls  # vLLM's stream: the output must begin with the JSON
    assert parse("llama3_json", text) == (text, [])


def test_gemma4_arguments_syntax():
    """Strings are anything between two ``<|"|>`` (commas, braces, quotes, brackets, the end tag, unicode);
    bare values are booleans, null, numbers (ints stay ints) or else strings; objects and lists nest;
    white space between the parts is ignored; keys may be wrapped as strings are (vLLM's
    ``_parse_gemma4_args``, save that "1e-05" is a number here and a string there)."""
    text = (
        '<|tool_call>call:search{query:<|"|>a, b: {c} "d" [e] 東京 \\ <tool_call|>\n<|"|>,\n'
        " n : -3 , x:2.5e3,y:1e-05,z:2.,big:1e400,f:false,t:true,none:null,nil:None,\n"
        'o:{k:[1, <|"|>s<|"|>, {deep:[]}, [true, null]], e:{}},l:[ ],w:some bare words,'
        '<|"|>quoted key<|"|>:<|"|><|"|>} <tool_call|>'
    )
    arguments = {
        "query": 'a, b: {c} "d" [e] 東京 \\ <tool_call|>\n',
        "n": -3,
        "x": 2500.0,
        "y": 1e-05,
        "z": 2.0,
        "big": "1e400",
        "f": False,
        "t": True,
        "none": None,
        "nil": None,
        "o": {"k": [1, "s", {"deep": []}, [True, None]], "e": {}},
        "l": [],
        "w": "some bare words",
        "quoted key": "",
    }
    text = "Sure." + text
    whole = ("Sure.", [ToolCall("search", dumps(arguments))])  # dumps: -3 stays "-3", not "-3.0"
    assert parse("gemma4", text) == whole
    assert streamed("gemma4", list(text) + [""]) == whole  # the end tag in the string cuts no call
    # digits other than ASCII's, Python's "1_000", "nan" are strings; nesting past the stack is malformed
    text = "<|tool_call>call:f{a:٣,b:1_000,c:nan}<tool_call|>"
    assert parse("gemma4", text) == ("", [ToolCall("f", '{"a": "٣", "b": "1_000", "c": "nan"}')])
    text = "<|tool_call>call:f{a:" + "[" * 5000 + "]" * 5000 + "}<tool_call|>"
    assert parse("gemma4", text) == (text, [])
    # two calls, one after the other, and no arguments
    text = '<|tool_call>call:get_time{}<tool_call|><|tool_call>call:f{a:<|"|>{}<|"|>}<tool_call|>'
    assert parse("gemma4", text) == ("", [ToolCall("get_time", "{}"), ToolCall("f", '{"a": "{}"}')])


def test_a_call_is_emitted_once_its_end_is_seen():
    for fmt in TOOL_CALL_FORMATS:
        stream = ToolCallStream(tool_call_format(fmt), TOOLS)
        assert stream.feed("Let me check. ", False) == ("Let me check. ", [])
        render = LAYOUTS[fmt][0]
        call = render(0, *WEATHER)
        start = tool_call_format(fmt).start
        if not call.startswith(start):
            call = start + call
        assert stream.feed(call[:-1], False) == ("", []), fmt
        assert stream.feed(call[-1:], False) == ("", expected(fmt, WEATHER)), fmt


def test_a_tail_that_may_begin_the_start_is_held_back():
    stream = ToolCallStream(tool_call_format("hermes"), None)
    assert stream.feed("Hello <tool", False) == ("Hello ", [])
    assert stream.feed("box> world <", False) == ("<toolbox> world ", [])
    assert stream.feed("", True) == ("<", [])


def split(text: str, rng: random.Random) -> list[str]:
    """``text`` cut at random places, empty deltas included."""
    cuts = sorted(rng.randrange(len(text) + 1) for _ in range(rng.randrange(len(text) + 2)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def streamed(fmt: str, deltas: list[str]) -> tuple[str, list[ToolCall]]:
    stream = ToolCallStream(tool_call_format(fmt), TOOLS)
    content, calls = "", []
    for k, delta in enumerate(deltas):
        c, new = stream.feed(delta, k == len(deltas) - 1)
        content, calls = content + c, calls + new
    return content, calls


def stream_texts(fmt: str):
    yield from (text for _, text, _, _ in filter(lambda c: c[0] == fmt, all_cases()))
    yield "Before." + tool_text(fmt, WEATHER) + "\n\nAfter." + tool_text(fmt, TIME) + " "
    yield tool_text(fmt, SEARCH) + "\n" + MALFORMED[fmt][0] + tool_text(fmt, TIME)


@pytest.mark.parametrize("fmt", sorted(TOOL_CALL_FORMATS))
def test_any_split_streams_what_parse_gives(fmt):
    rng = random.Random(fmt)
    for text in stream_texts(fmt):
        whole = parse(fmt, text)
        assert streamed(fmt, list(text) + [""]) == whole, text
        for _ in range(30):
            assert streamed(fmt, split(text, rng)) == whole, text


def test_unknown_parser_names_the_flag_and_the_known_ones():
    with pytest.raises(ValueError, match="--tool-call-parser 'qwen25' is not known") as e:
        tool_call_format("qwen25")
    assert all(name in str(e.value) for name in TOOL_CALL_FORMATS)
