"""Request fields as clients send them (found by fuzzing the server): a null field takes its default, as OpenAI's
API and vLLM's request models allow; a sampling parameter the engine refuses is named in the 400's ``param``
(not the prompt); a text content part without its text says so; a ``response_format`` key the server does not
read is refused by name; ``tool_choice`` without tools is refused, as vLLM refuses it; a union's member is not
named in ``param``. After each refusal the server still serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402

TINYPY = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")
VOCAB, EOS = 4096, 0  # zoo/tinypy/config.json
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def http():
    config = EngineConfig(TINYPY, device="cpu", max_num_seqs=4)
    with TestClient(build_app(config, log_interval=1e9)) as client:
        yield client


NULLABLE_COMPLETION = (
    "n",
    "stream",
    "echo",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "add_special_tokens",
    "stop",
    "seed",
)
NULLABLE_CHAT = (
    "n",
    "stream",
    "include_reasoning",
    "add_generation_prompt",
    "continue_final_message",
    "logprobs",
    "tool_choice",
)


def test_null_fields_take_their_defaults(http):
    nulls = dict.fromkeys(NULLABLE_COMPLETION)
    r = http.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 2, **nulls})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1  # n's default
    nulls = dict.fromkeys(NULLABLE_CHAT)
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, **nulls})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    "chat, body, param",
    [
        (False, {"logit_bias": {str(VOCAB): 1}}, "logit_bias"),
        (True, {"stop_token_ids": [VOCAB]}, "stop_token_ids"),
        (False, {"allowed_token_ids": [VOCAB + 5]}, "allowed_token_ids"),
        (False, {"allowed_token_ids": [EOS], "min_tokens": 1}, "min_tokens"),
    ],
)
def test_a_sampling_parameter_the_engine_refuses_is_named(http, chat, body, param):
    head = {"messages": USER} if chat else {"prompt": "x"}
    r = http.post(
        "/v1/chat/completions" if chat else "/v1/completions",
        json={**head, "max_tokens": 3, **body},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_text_part_without_text_says_so(http):
    messages = [{"role": "user", "content": [{"type": "text"}]}]
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (
        error["param"] == "messages.0.content.0.text"
        and "needs a 'text' string" in error["message"]
    )


def serves(http) -> None:
    r = http.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 2})
    assert r.status_code == 200, r.text


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "response_format, param",
    [
        ({"type": "json_object", "schema": SCHEMA}, "response_format.schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": SCHEMA}, "strict": True},
            "response_format.strict",
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strikt": True}},
            "response_format.json_schema.strikt",
        ),
        ({"type": "text", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema"),
        ({"type": "json_object", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema"),
    ],
)
@pytest.mark.parametrize("chat", [False, True])
def test_a_response_format_key_not_read_is_refused_by_name(http, response_format, param, chat):
    """Each was ignored, the output unconstrained or less constrained than the client asked."""
    head = {"messages": USER} if chat else {"prompt": "x"}
    r = http.post(
        "/v1/chat/completions" if chat else "/v1/completions",
        json={**head, "max_tokens": 3, "response_format": response_format},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]
    serves(http)


def test_response_format_with_every_key_openai_defines_is_served(http):
    pytest.importorskip("xgrammar")
    described = {"name": "a", "description": "an object", "schema": SCHEMA, "strict": True}
    for response_format in (
        {"type": "json_schema", "json_schema": described},
        {"type": "json_object", "json_schema": None},
        {"type": "text"},
    ):
        r = http.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 3, "response_format": response_format},
        )
        assert r.status_code == 200, (response_format, r.text)


@pytest.mark.parametrize("tools", [{}, {"tools": None}])
def test_tool_choice_auto_without_tools_is_refused_as_vllm_refuses_it(http, tools):
    r = http.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "tool_choice": "auto", **tools},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    r = http.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "tool_choice": "none", **tools},
    )
    assert r.status_code == 200, r.text


TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(
    "tool_choice, param",
    [
        ({"type": "allowed_tools", "function": {"name": "f"}}, "tool_choice.type"),
        ({"type": "function", "name": "f"}, "tool_choice.function"),
        ({"type": "function", "function": {"name": 5}}, "tool_choice.function.name"),
    ],
)
def test_a_union_member_is_not_named_in_the_param(http, tool_choice, param):
    """pydantic puts the union member that failed (the class ``NamedToolChoice``) in the error's location."""
    r = http.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "tools": TOOLS, "tool_choice": tool_choice},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "NamedToolChoice" not in error["message"], error
    serves(http)


@pytest.mark.parametrize("key", ["messages", "self", "conversations", "sanitize_control_tokens"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_chat_template_kwargs_that_the_call_sets_are_refused_by_name(http, key, path):
    """A collision was a 400 naming ``messages`` with transformers' TypeError; ``sanitize_control_tokens`` changed
    apply_chat_template's call."""
    body = {"messages": USER, "chat_template_kwargs": {key: True}}
    r = http.post(path, json={**body, "max_tokens": 2} if path != "/tokenize" else body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == f"chat_template_kwargs.{key}", error
    assert "multiple values" not in error["message"], error
    serves(http)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "f"}}]
)
def test_a_function_defined_twice_is_refused_where_tool_choice_forces_a_call(http, tool_choice):
    """The forced call's constraint kept the last definition alone: the first one's schema was dropped."""
    second = {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}
    tools = [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": second}}]
    r = http.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "tools": tools, "tool_choice": tool_choice},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools.1.function.name", r.text
    serves(http)


def _events(text: str) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("chat", [False, True])
def test_stream_options_ask_for_usage_unless_include_usage_is_false_as_in_vllm(http, chat):
    """vLLM's StreamOptions default include_usage to true: ``stream_options: {}`` ends the stream with usage."""
    head = {"messages": USER} if chat else {"prompt": "def f("}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    for options, usage in (({}, True), ({"include_usage": False}, False)):
        body = {**head, "max_tokens": 3, "stream": True, "stream_options": options}
        r = http.post(path, json=body)
        assert r.status_code == 200, r.text
        last = _events(r.text)[-1]
        assert (last["choices"] == [] and last["usage"]["completion_tokens"] == 3) == usage, last
    options = {"include_usage": False, "continuous_usage_stats": True}
    r = http.post(path, json={**head, "max_tokens": 3, "stream": True, "stream_options": options})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options.continuous_usage_stats"
    serves(http)


@pytest.mark.parametrize(
    "chat, field, neutral, other",
    [
        (True, "echo", False, True),
        (False, "return_tokens_as_token_ids", False, True),
        (True, "return_token_ids", False, True),
        (False, "bad_words", [], ["x"]),
    ],
)
def test_vllm_fields_at_their_default_are_accepted_and_refused_otherwise(
    http, chat, field, neutral, other
):
    """A client that sends vLLM's defaults is served; any other value is refused by name."""
    head = {"messages": USER} if chat else {"prompt": "x"}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = http.post(path, json={**head, "max_tokens": 2, field: neutral})
    assert r.status_code == 200, r.text
    r = http.post(path, json={**head, "max_tokens": 2, field: other})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_parameter", error
    serves(http)


def test_a_named_functions_schema_that_does_not_compile_is_named_as_its_field(http):
    """The named function's parameters are the constraint: a fault in them was reported as ``tool_choice``'s."""
    pytest.importorskip("xgrammar")
    tools = [
        TOOLS[0],
        {"type": "function", "function": {"name": "g", "parameters": {"type": "wat"}}},
    ]
    named = {"type": "function", "function": {"name": "g"}}
    r = http.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "tools": tools, "tool_choice": named},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools.1.function.parameters" and "wat" in error["message"], error
    serves(http)
