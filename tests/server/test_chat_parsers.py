"""A chat's thinking and tool calls through the server (server/chat_output.py): the zoo's tinypy, given a chat
template that renders tools, tool calls and an ``enable_thinking`` switch, answers what ``guided_choice`` makes
it write, which ``--reasoning-parser qwen3 --tool-call-parser hermes`` split into ``reasoning_content``,
``content`` and ``tool_calls``, whole and streamed; tools and template variables reach the template."""

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402
from outpace.validation import ConfigError  # noqa: E402

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TEMPLATE = (
    "{% if tools %}<|system|>\ntools: {{ tools | tojson }}<|endoftext|>\n{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' }}"
    "{% for c in m.get('tool_calls') or [] %}call {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}{% endfor %}"
    "{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """tinypy with the template above (its weights linked, not copied)."""
    out = tmp_path_factory.mktemp("tinypy_tools")
    for f in (ZOO / "tinypy").iterdir():
        (out / f.name).symlink_to(f)
    config = json.loads((ZOO / "tinypy" / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").unlink()
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return out


def config(model_dir) -> EngineConfig:
    return EngineConfig(
        str(model_dir), device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=4
    )


@pytest.fixture(scope="module")
def http(model_dir):
    app = build_app(
        config(model_dir), log_interval=1e9, reasoning_parser="qwen3", tool_call_parser="hermes"
    )
    with TestClient(app) as client:
        yield client


def chat(http, output: str, **body):
    """A greedy chat whose output is ``output`` exactly (guided_choice)."""
    body = {
        "messages": USER,
        "max_tokens": 200,
        "temperature": 0,
        "guided_choice": [output],
        **body,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(http, output: str, **body) -> tuple[dict, list[dict], str]:
    """The stream's deltas merged: content and reasoning_content concatenated, tool_calls listed; and the
    finish reason. (A forced tool choice constrains the output itself: ``output`` is then not asked for.)"""
    guided = (
        {}
        if "tool_choice" in body and body["tool_choice"] != "none"
        else {"guided_choice": [output]}
    )
    body = {"messages": USER, "max_tokens": 200, "temperature": 0, **guided, **body}
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    merged, calls, finish = {"content": "", "reasoning_content": ""}, [], None
    for c in chunks:
        delta = c["choices"][0]["delta"]
        for key in merged:
            merged[key] += delta.get(key) or ""
        calls += delta.get("tool_calls") or []
        finish = c["choices"][0]["finish_reason"] or finish
    return merged, calls, finish


def test_thinking_opened_by_the_template_is_split_off(http):
    output = "two and two</think>\n\nFour."
    on = chat(http, output, chat_template_kwargs={"enable_thinking": True})
    message = on["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("two and two", "\n\nFour.")
    off = chat(http, output, chat_template_kwargs={"enable_thinking": False})
    message = off["choices"][0]["message"]  # the prompt opens no block: all content
    assert (message["reasoning_content"], message["content"]) == (None, output)
    assert on["usage"]["prompt_tokens"] > off["usage"]["prompt_tokens"]  # "<think>\n" in the prompt
    merged, calls, finish = streamed(http, output, chat_template_kwargs={"enable_thinking": True})
    assert merged == {"reasoning_content": "two and two", "content": "\n\nFour."}
    assert (calls, finish) == ([], "stop")


def test_a_tool_call_after_thinking(http):
    output = "<think>the user wants weather</think>\n" + CALL
    answer = chat(http, output, tools=[WEATHER])
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "the user wants weather"
    assert message["content"] == "\n"
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    without = chat(http, output)  # no tools in the template, and no parsing of calls
    assert answer["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]
    assert "tool_calls" not in without["choices"][0]["message"]
    assert without["choices"][0]["finish_reason"] == "stop"
    merged, calls, finish = streamed(http, output, tools=[WEATHER])
    assert merged == {"reasoning_content": "the user wants weather", "content": "\n"}
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert finish == "tool_calls"


def test_tool_choice_none_leaves_calls_in_the_content(http):
    message = chat(http, CALL, tools=[WEATHER], tool_choice="none")["choices"][0]["message"]
    assert message["content"] == CALL and "tool_calls" not in message


def test_the_next_turn_sends_the_call_and_its_result_back(http):
    turn = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    message = chat(http, "Sunny.", messages=turn, tools=[WEATHER])["choices"][0]["message"]
    assert message["content"] == "Sunny."
    turn[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    r = http.post("/v1/chat/completions", json={"messages": turn, "max_tokens": 4})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages.1.tool_calls.0.function.arguments"


CITY = {
    "type": "function",
    "function": {
        "name": "pick_city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "pick_city"}}


def test_a_named_tool_choice_returns_that_call(http):
    """Constrained to the function's arguments (no parser needed), whole and streamed."""
    body = {"messages": USER, "max_tokens": 30, "temperature": 0, "tools": [WEATHER, CITY]}
    r = http.post("/v1/chat/completions", json={**body, "tool_choice": NAMED})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "pick_city"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    merged, calls, finish = streamed(http, "unused", tool_choice=NAMED, tools=[WEATHER, CITY])
    assert [c["function"] for c in calls] == [call["function"]] and finish == "tool_calls"


def test_a_required_tool_choice_returns_calls_of_the_tools(http):
    body = {"messages": USER, "max_tokens": 60, "temperature": 0, "tools": [WEATHER, CITY]}
    r = http.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    choice = r.json()["choices"][0]
    message = choice["message"]
    if choice["finish_reason"] == "length":  # cut inside the JSON: the text as it is
        assert message["content"] and "tool_calls" not in message
        return
    assert choice["finish_reason"] == "tool_calls" and message["tool_calls"]
    for call in message["tool_calls"]:
        assert call["function"]["name"] in ("get_weather", "pick_city")
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": NAMED}, "tool_choice.function.name"),
        ({"tools": [CITY], "tool_choice": NAMED, "guided_regex": "a+"}, "guided_regex"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        ({"functions": [WEATHER["function"]]}, "functions"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ],
)
def test_requests_the_server_cannot_serve_are_refused_by_field(http, body, param):
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tools_without_a_tool_call_parser_are_refused(model_dir):
    with TestClient(build_app(config(model_dir), log_interval=1e9)) as http:
        body = {"messages": USER, "max_tokens": 4, "tools": [WEATHER]}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert "--tool-call-parser" in r.json()["error"]["message"]
        r = http.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
        assert r.status_code == 200, r.text


def test_unknown_parsers_are_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="--reasoning-parser 'nope'"):
        build_app(EngineConfig(str(tmp_path)), reasoning_parser="nope")
    with pytest.raises(ConfigError, match="--tool-call-parser"):
        build_app(EngineConfig(str(tmp_path)), tool_call_parser="nope")


def test_tokenize_renders_tools_and_template_variables_as_a_chat_does(http):
    def count(**body) -> int:
        r = http.post("/tokenize", json={"messages": USER, **body})
        assert r.status_code == 200, r.text
        return r.json()["count"]

    plain = count()
    assert count(tools=[WEATHER]) > plain
    assert count(chat_template_kwargs={"enable_thinking": True}) > plain
    thinking = chat(http, "x", chat_template_kwargs={"enable_thinking": True})
    assert thinking["usage"]["prompt_tokens"] == count(
        chat_template_kwargs={"enable_thinking": True}
    )
    r = http.post("/tokenize", json={"prompt": "x", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
