"""A chat's thinking and tool calls through the server (server/chat_output.py): the zoo's tinypy, given a chat
template that renders tools, tool calls and an ``enable_thinking`` switch, answers what ``guided_choice`` makes
it write, which ``--tool-call-parser hermes`` parses into ``content`` and ``tool_calls``, whole and streamed;
with ``--reasoning-parser qwen3`` the thinking a template opens is ``reasoning_content`` and a constraint holds
after it; tools and template variables reach the template."""

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402
from outpace.server.chat_output import ChatParsing  # noqa: E402
from outpace.server.reasoning import reasoning_format  # noqa: E402
from outpace.server.tool_calls import tool_call_format  # noqa: E402
from outpace.validation import ConfigError  # noqa: E402

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TEMPLATE = (
    "{% if tools %}<|system|>\ntools: {{ tools | tojson }}<|endoftext|>\n{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' }}"
    "{% for c in m.get('tool_calls') or [] %}call {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}{% endfor %}"
    "{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking %}<think>\n"
    "{% elif enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_ARGS = {"city": "Paris"}
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
    with TestClient(build_app(config(model_dir), log_interval=1e9, tool_call_parser="hermes")) as c:
        yield c


@pytest.fixture(scope="module")
def thinking(model_dir):
    app = build_app(config(model_dir), log_interval=1e9, reasoning_parser="qwen3")
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


def streamed(http, output: str | None, **body) -> tuple[dict, list[dict], str]:
    """The stream's deltas merged: content and reasoning_content concatenated, tool_calls listed; and the
    finish reason. ``output``: what guided_choice makes the model write (None: not constrained)."""
    guided = {} if output is None else {"guided_choice": [output]}
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


def free(client, **body) -> dict:
    body = {"messages": USER, "max_tokens": 12, "temperature": 0, **body}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_thinking_the_template_opens_is_reasoning_and_constraints_wait_for_its_end(http, thinking):
    """tinypy never writes </think>: with the block opened by the prompt, its whole output is reasoning, and a
    constraint (which holds after the thinking) leaves it as it is, whole and streamed."""
    opened = {"chat_template_kwargs": {"enable_thinking": True}}
    text = free(http, **opened)["content"]  # (no reasoning parser)
    assert text
    assert free(thinking, **opened) == {
        "role": "assistant",
        "content": None,
        "reasoning_content": text,
    }
    constrained = free(thinking, response_format={"type": "json_object"}, **opened)
    assert constrained["reasoning_content"] == text
    merged, calls, finish = streamed(thinking, None, max_tokens=12, **opened)
    assert merged == {"reasoning_content": text, "content": ""} and not calls


def test_a_prompt_that_ends_thinking_leaves_an_answer_under_its_constraint(thinking):
    closed = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(thinking, "Four.", **closed)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (None, "Four.")
    merged, _, finish = streamed(thinking, "Four.", **closed)
    assert merged == {"reasoning_content": "", "content": "Four."} and finish == "stop"


def test_reasoning_then_a_tool_call_whole_and_streamed():
    """The two parsers chained (server/chat_output.py), on a text cut into pieces."""
    parsing = ChatParsing(
        reasoning_format("qwen3"), tool_call_format("hermes"), [WEATHER], "<|assistant|>\n"
    )
    text = "<think>the user wants weather</think>\n" + CALL
    message = parsing.message(text)
    assert message["reasoning_content"] == "the user wants weather"
    assert message["content"] == "\n"
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    for size in (1, 3, 7, len(text)):
        stream, merged, calls = parsing.stream(), {}, []
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for k, piece in enumerate(pieces):
            fields = stream.feed(piece, final=k == len(pieces) - 1)
            calls += fields.pop("tool_calls", [])
            for key, value in fields.items():
                merged[key] = merged.get(key, "") + value
        assert merged == {"reasoning_content": "the user wants weather", "content": "\n"}
        assert [c["function"] for c in calls] == [call["function"]] and stream.num_calls == 1


def test_a_tool_call_after_content(http):
    output = "Let me look.\n" + CALL
    answer = chat(http, output, tools=[WEATHER])
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me look.\n" and "reasoning_content" not in message
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    without = chat(http, output)  # no tools in the template, and no parsing of calls
    assert answer["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]
    assert "tool_calls" not in without["choices"][0]["message"]
    assert without["choices"][0]["finish_reason"] == "stop"
    merged, calls, finish = streamed(http, output, tools=[WEATHER])
    assert merged == {"reasoning_content": "", "content": "Let me look.\n"}
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
    """Constrained to the function's arguments (no parser needed), whole and streamed; ``strict`` holds. The call
    was the request's, so the choice finishes "stop" (OpenAI's, vLLM's), not "tool_calls"."""
    strict = {**CITY, "function": {**CITY["function"], "strict": True}}
    body = {"messages": USER, "max_tokens": 30, "temperature": 0, "tools": [WEATHER, strict]}
    r = http.post("/v1/chat/completions", json={**body, "tool_choice": NAMED})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "pick_city"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    merged, calls, finish = streamed(http, None, tool_choice=NAMED, tools=[WEATHER, CITY])
    assert [c["function"] for c in calls] == [call["function"]] and finish == "stop"


@pytest.mark.parametrize(
    "tool_choice, finish",
    [(NAMED, "stop"), ("required", "tool_calls"), ("auto", "tool_calls"), ("none", "stop")],
)
def test_finish_reason_of_a_tool_choice_whole_and_streamed(http, tool_choice, finish):
    """Finishing "tool_calls" where the model chose the calls ("auto", or which tools under "required"), "stop" for
    the call of a named function (the request's own choice) and for none: streamed as whole (vLLM since its PR
    #25054, OpenAI). A forced choice writes what its constraint allows (CITY's one short call); the others, CALL."""
    forced = tool_choice not in ("auto", "none")
    body = {"messages": USER, "max_tokens": 200, "temperature": 0, "tool_choice": tool_choice}
    body.update({"tools": [CITY]} if forced else {"tools": [WEATHER], "guided_choice": [CALL]})
    r = http.post("/v1/chat/completions", json=body)
    choice = r.json()["choices"][0]
    assert ("tool_calls" in choice["message"]) == (tool_choice != "none"), choice
    assert choice["finish_reason"] == finish
    _, calls, streamed_finish = streamed(http, None, **body)
    assert bool(calls) == (tool_choice != "none") and streamed_finish == finish


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


def _located(name: str, city: dict) -> dict:
    """A tool whose parameters refer to a definition under ``$defs``, as pydantic writes them."""
    parameters = {
        "type": "object",
        "properties": {"loc": {"$ref": "#/$defs/Location"}},
        "required": ["loc"],
        "$defs": {"Location": city},
    }
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


CITY_ONLY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_required_tool_choice_takes_tools_whose_parameters_use_defs(http):
    """Their ``$defs`` move to the top of the one schema tool_choice "required" builds (vLLM's
    ``get_tool_schema_defs``), where "#/$defs/..." finds them; two tools defining one name differently are
    refused."""
    tools = [_located("where", CITY_ONLY), _located("also_where", CITY_ONLY)]
    body = {"messages": USER, "max_tokens": 40, "temperature": 0, "tools": tools}
    r = http.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] != "length":  # (cut inside the JSON: the text as it is)
        for call in choice["message"]["tool_calls"]:
            assert isinstance(json.loads(call["function"]["arguments"])["loc"]["city"], str)
    other = _located("elsewhere", {**CITY_ONLY, "required": []})
    r = http.post(
        "/v1/chat/completions", json={**body, "tools": [tools[0], other], "tool_choice": "required"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "$defs/Location" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": NAMED}, "tool_choice.function.name"),
        ({"tools": [CITY], "tool_choice": NAMED, "guided_regex": "a+"}, "guided_regex"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [{**CITY, "function": {**CITY["function"], "strict": True}}]},
            "tools.0.function.strict",
        ),
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


def test_include_reasoning_false_and_parallel_tool_calls_false():
    """vLLM's include_reasoning: false drops the thinking; OpenAI's parallel_tool_calls: false keeps the first
    call alone, whole and streamed."""
    two = "<think>r</think>" + CALL + CALL.replace("Paris", "Rome")
    parsing = ChatParsing(
        reasoning_format("qwen3"),
        tool_call_format("hermes"),
        [WEATHER],
        "<|assistant|>\n",
        include_reasoning=False,
        max_calls=1,
    )
    message = parsing.message(two)
    assert "reasoning_content" not in message and message["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"city": "Paris"}
    ]
    stream, sent = parsing.stream(), []
    for k in range(0, len(two), 5):
        sent.append(stream.feed(two[k : k + 5], final=k + 5 >= len(two)))
    assert not any("reasoning_content" in f for f in sent)
    assert [c["index"] for f in sent for c in f.get("tool_calls", [])] == [0]


def test_parallel_tool_calls_false_through_the_server(http):
    two = CALL + CALL.replace("Paris", "Rome")
    both = chat(http, two, tools=[WEATHER])["choices"][0]["message"]["tool_calls"]
    assert len(both) == 2
    first = chat(http, two, tools=[WEATHER], parallel_tool_calls=False)
    assert [c["function"] for c in first["choices"][0]["message"]["tool_calls"]] == [
        both[0]["function"]
    ]


def test_the_official_client_reads_calls_and_reasoning(http, thinking):
    """The openai package's own types, whole and streamed (the TestClient as its HTTP client)."""
    openai = pytest.importorskip("openai")

    def client(app_client):
        url = "http://testserver/v1"
        return openai.OpenAI(base_url=url, api_key="-", http_client=app_client, max_retries=0)

    tools_client = client(http)
    model = tools_client.models.list().data[0].id
    guided = {"guided_choice": ["Let me look.\n" + CALL]}
    body = dict(model=model, messages=USER, tools=[WEATHER], max_tokens=200, temperature=0)
    answer = tools_client.chat.completions.create(**body, extra_body=guided)
    [call] = answer.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        WEATHER_ARGS,
    )
    assert answer.choices[0].finish_reason == "tool_calls"
    parts: dict[int, dict] = {}
    for chunk in tools_client.chat.completions.create(**body, extra_body=guided, stream=True):
        deltas = chunk.choices[0].delta.tool_calls if chunk.choices else None
        for delta in deltas or []:
            part = parts.setdefault(delta.index, {"name": "", "arguments": ""})
            part["name"] += delta.function.name or ""
            part["arguments"] += delta.function.arguments or ""
    assert [(p["name"], json.loads(p["arguments"])) for p in parts.values()] == [
        ("get_weather", WEATHER_ARGS)
    ]
    opened = {"chat_template_kwargs": {"enable_thinking": True}}
    message = (
        client(thinking)
        .chat.completions.create(
            model=model, messages=USER, max_tokens=12, temperature=0, extra_body=opened
        )
        .choices[0]
        .message
    )
    assert message.content is None and message.reasoning_content == free(http, **opened)["content"]


def test_continue_final_message_continues_the_assistants_text(http, model_dir):
    """vLLM's continue_final_message: the prompt ends inside the last (assistant) message, so the answer is what
    a completion of that text gives."""
    from transformers import AutoTokenizer

    turn = [*USER, {"role": "assistant", "content": "def add(a, b):"}]
    text = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        turn, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    assert text.endswith("def add(a, b):")
    body = {"messages": turn, "max_tokens": 8, "temperature": 0, "add_generation_prompt": False}
    r = http.post("/v1/chat/completions", json={**body, "continue_final_message": True})
    completion = {"prompt": text, "max_tokens": 8, "temperature": 0, "add_special_tokens": False}
    want = http.post("/v1/completions", json=completion).json()["choices"][0]["text"]
    assert r.json()["choices"][0]["message"]["content"] == want
    for wrong in ({**body, "add_generation_prompt": True}, {**body, "messages": USER}):
        r = http.post("/v1/chat/completions", json={**wrong, "continue_final_message": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_sglangs_separate_reasoning_and_stream_reasoning(http, thinking):
    """separate_reasoning false leaves the thinking in the content; stream_reasoning false sends it in one delta
    once it ends."""
    opened = {"chat_template_kwargs": {"enable_thinking": True}}
    text = free(http, **opened)["content"]
    assert free(thinking, separate_reasoning=False, **opened) == {
        "role": "assistant",
        "content": text,
    }
    parsing = ChatParsing(
        reasoning_format("qwen3"), None, None, "<|assistant|>\n", stream_reasoning=False
    )
    whole = "<think>one, two, three</think>Four."
    stream = parsing.stream()
    sent = [
        stream.feed(whole[k : k + 3], final=k + 3 >= len(whole)) for k in range(0, len(whole), 3)
    ]
    thoughts = [f["reasoning_content"] for f in sent if "reasoning_content" in f]
    assert thoughts == ["one, two, three"]
    assert "".join(f.get("content", "") for f in sent) == "Four."
