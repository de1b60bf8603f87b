"""Limits and safety of the server, as a real process: bearer auth (401), a bounded queue (429), every
bad input answered with an OpenAI-style error (400/404/405/413) while the server keeps serving,
hypothesis-fuzzed bodies never giving a 500, and SIGTERM draining in-flight streams."""

import asyncio
import json

import pytest

for _dependency in ("fastapi", "uvicorn", "prometheus_client"):  # the server extra
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.server_helpers import PROMPTS, ServerProcess, sse_events, stream_text, wait_idle  # noqa: E402

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_MODEL_LEN, MAX_TOKENS, MAX_BODY, MAX_N = 256, 32, 65536, 4


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(
        "--api-key",
        KEY,
        "--max-queued-requests",
        "2",
        "--max-num-seqs",  # (4 places in the running batch and 2 to wait for one: 24 at once overflow)
        "4",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-tokens-limit",
        str(MAX_TOKENS),
        "--max-body-bytes",
        str(MAX_BODY),
        "--max-n",
        str(MAX_N),
    )
    try:
        yield proc.wait_ready()
        assert proc.terminate() == 0, proc.output()
    finally:
        proc.close()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
        yield c


def valid_request_succeeds(http) -> None:
    r = http.post(
        "/v1/completions", json={"prompt": "import os", "max_tokens": 2, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def assert_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    for w in words:
        assert w in err["message"] or w == err["param"] or w == err["code"], (w, err)
    return err


def test_auth(server):
    body = {"prompt": "x", "max_tokens": 1}
    assert_error(httpx.post(server.url + "/v1/completions", json=body), 401, "invalid_api_key")
    assert_error(httpx.get(server.url + "/v1/models"), 401)
    assert_error(
        httpx.post(
            server.url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"}
        ),
        401,
        "API key",
    )
    assert_error(
        httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": KEY}), 401
    )
    assert httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]["id"] == "tinypy"
    assert httpx.get(server.url + "/health").status_code == 200  # health and metrics stay open
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_openai_client_with_key(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert (
        client.completions.create(
            model="tinypy", prompt="def f():", max_tokens=3
        ).usage.completion_tokens
        >= 1
    )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="suffix is not supported"):
        client.completions.create(model="tinypy", prompt="x", max_tokens=1, suffix="y")


LONG_TEXT = "\n".join(PROMPTS)  # far more than MAX_MODEL_LEN tokens

BAD = [  # (endpoint, body, status, words the error must contain (message, param or code))
    ("c", b'{"prompt": "x", ', 400, ["valid JSON"]),
    ("c", b"not json at all", 400, ["valid JSON"]),
    ("c", b"", 400, ["empty"]),
    ("c", b"[1, 2, 3]", 400, ["JSON object"]),
    ("c", b'"just a string"', 400, ["JSON object"]),
    ("c", {"max_tokens": 4}, 400, ["prompt"]),
    ("c", {"prompt": ""}, 400, ["prompt", "empty"]),
    ("c", {"prompt": []}, 400, ["prompt", "empty"]),
    ("c", {"prompt": [[]]}, 400, ["prompt", "empty"]),
    ("c", {"prompt": {"text": "x"}}, 400, ["prompt"]),
    ("c", {"prompt": [1, "a"]}, 400, ["prompt"]),
    ("c", {"prompt": [5, 10**9]}, 400, ["prompt", "vocabulary"]),
    ("c", {"prompt": [-1]}, 400, ["prompt", "vocabulary"]),
    ("c", {"prompt": LONG_TEXT}, 400, ["prompt", "context_length_exceeded"]),
    (
        "c",
        {"prompt": LONG_TEXT[:700], "max_tokens": MAX_TOKENS},
        400,
        ["max_tokens", "context_length_exceeded"],
    ),
    ("c", {"prompt": "x", "max_tokens": MAX_TOKENS + 1}, 400, ["max_tokens", "limit"]),
    ("c", {"prompt": "x", "max_tokens": -1}, 400, ["max_tokens"]),
    ("c", {"prompt": "x", "max_tokens": 0}, 400, ["max_tokens"]),
    ("c", {"prompt": "x", "max_tokens": "five"}, 400, ["max_tokens"]),
    ("c", {"prompt": "x", "max_tokens": 2.5}, 400, ["max_tokens"]),
    ("c", {"prompt": "x", "max_tokens": [5]}, 400, ["max_tokens"]),
    ("c", {"prompt": "x", "temperature": -0.5}, 400, ["temperature"]),
    ("c", {"prompt": "x", "temperature": "hot"}, 400, ["temperature"]),
    ("c", {"prompt": "x", "top_p": 0}, 400, ["top_p"]),
    ("c", {"prompt": "x", "top_p": 1.5}, 400, ["top_p"]),
    ("c", {"prompt": "x", "top_k": -2}, 400, ["top_k"]),
    ("c", {"prompt": "x", "min_p": 2}, 400, ["min_p"]),
    ("c", {"prompt": "x", "n": 0}, 400, ["n"]),
    ("c", {"prompt": "x", "n": MAX_N + 1}, 400, ["n", "limit"]),
    ("c", {"prompt": "x", "seed": -2}, 400, ["seed"]),
    ("c", {"prompt": "x", "seed": 2**70}, 400, ["seed"]),
    ("c", {"prompt": "x", "stop": 5}, 400, ["stop"]),
    ("c", {"prompt": "x", "stop": [""]}, 400, ["stop"]),
    ("c", {"prompt": "x", "stream": "maybe"}, 400, ["stream"]),
    ("c", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, ["stream_options"]),
    (
        "c",
        {"prompt": "x", "logprobs": 1, "frobnicate": 2},
        400,
        ["frobnicate", "unsupported_parameter"],
    ),
    ("c", {"prompt": "x", "presence_penalty": 2.5}, 400, ["presence_penalty"]),
    ("c", {"prompt": "x", "logit_bias": {"five": 10}}, 400, ["logit_bias"]),
    ("c", {"prompt": "x", "response_format": {"type": "yaml"}}, 400, ["response_format", "yaml"]),
    ("c", {"prompt": "x", "response_format": {}}, 400, ["response_format.type"]),
    (
        "c",
        {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": "x"}},
        400,
        ["response_format.json_schema"],
    ),
    ("c", {"prompt": "x", "model": "gpt-4"}, 404, ["model_not_found", "gpt-4"]),
    ("c", {"prompt": "x", "model": 7}, 400, ["model"]),
    ("h", {"messages": []}, 400, ["messages"]),
    ("h", {"prompt": "x"}, 400, ["messages"]),
    ("h", {"messages": "hi"}, 400, ["messages"]),
    ("h", {"messages": [{"content": "hi"}]}, 400, ["messages.0.role"]),
    ("h", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, ["messages", "wizard"]),
    (
        "h",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        400,
        ["image_url"],
    ),
    ("h", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, ["max_tokens"]),
    (
        "h",
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        400,
        ["tools"],
    ),
    (
        "h",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": MAX_TOKENS + 1},
        400,
        ["max_completion_tokens"],
    ),
    (
        "h",
        {"messages": [{"role": "user", "content": LONG_TEXT}]},
        400,
        ["messages", "context_length_exceeded"],
    ),
    (
        "h",
        {"messages": [{"role": "user", "content": "hi"}], "model": "nope"},
        404,
        ["model_not_found"],
    ),
]


@pytest.mark.parametrize(
    "endpoint,body,status,words", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)]
)
def test_bad_input(http, endpoint, body, status, words):
    path = "/v1/completions" if endpoint == "c" else "/v1/chat/completions"
    r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
    assert_error(r, status, *words)
    valid_request_succeeds(http)


def test_bad_routes_and_sizes(http):
    assert_error(http.get("/v1/completions"), 405)
    assert_error(http.post("/v1/nothing", json={}), 404)
    assert_error(http.get("/v1/models/gpt-4"), 404, "model_not_found")
    assert http.get("/v1/models/tinypy").json()["id"] == "tinypy"
    assert_error(http.post("/v1/completions", json={"prompt": "x" * MAX_BODY}), 413)
    chunks = iter([b'{"prompt": "', b"x" * MAX_BODY, b'"}'])  # no content-length: chunked upload
    assert_error(http.post("/v1/completions", content=chunks), 413)
    assert_error(http.post("/v1/completions", content=b"[" * 5000 + b"]" * 5000), 400)
    valid_request_succeeds(http)


def test_queue_full_gives_429(server):
    body = {"prompt": "def main():", "max_tokens": 16, "temperature": 0, "ignore_eos": True}

    async def run():
        limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
        async with httpx.AsyncClient(
            base_url=server.url, headers=AUTH, limits=limits, timeout=120
        ) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(24)))

    responses = asyncio.run(run())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429} and codes.count(429) > 0 and codes.count(200) >= 1, codes
    for r in responses:
        if r.status_code == 429:
            assert_error(r, 429, "queue_full")
        else:
            assert r.json()["usage"]["completion_tokens"] == 16
    wait_idle(server.url)


FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "stop_token_ids",
    "seed",
    "ignore_eos",
    "logprobs",
    "echo",
    "best_of",
    "logit_bias",
    "presence_penalty",
    "user",
    "add_generation_prompt",
    "tools",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
valid = {  # each field valid on its own; a body is these plus a few junk or out-of-range fields
    "model": st.just("tinypy"),
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1),
    "n": st.integers(1, 2),
    "stream": st.booleans(),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=2),
    "seed": st.integers(0, 2**63 - 1),
    "ignore_eos": st.booleans(),
    "echo": st.booleans(),
    "user": st.text(max_size=5),
}
required = {
    "prompt": st.sampled_from(
        [
            "def f(x):",
            "import numpy as np\n",
            "\u00e9\u00e8 \U0001f600",
            [1, 2, 3],
            [[4, 5], [6]],
            ["a", "b"],
        ]
    ),
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant"]),
                "content": st.text(max_size=30),
            }
        ),
        min_size=1,
        max_size=3,
    ),
}
bad_values = {
    "model": st.sampled_from(["other", ""]),
    "max_tokens": st.integers(-3, 0) | st.integers(MAX_TOKENS + 1, 10**6),
    "temperature": st.floats(-3, -0.01) | st.just(float("nan")) | st.just(float("inf")),
    "top_p": st.floats(1.01, 3) | st.floats(-1, 0),
    "top_k": st.integers(-10, -2),
    "n": st.integers(-1, 0) | st.integers(MAX_N + 1, 100),
    "seed": st.integers(-(2**70), -1) | st.integers(2**63, 2**70),
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["bot", "tool", ""]),
                "content": st.text(max_size=5) | st.none(),
            }
        ),
        max_size=2,
    ),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}
mutations = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=2) | st.dictionaries(
    st.sampled_from(sorted(bad_values)), st.none(), min_size=1, max_size=2
).flatmap(lambda d: st.fixed_dictionaries({k: bad_values[k] for k in d}))
bodies = st.tuples(st.fixed_dictionaries(required, optional=valid), mutations).map(
    lambda t: {**t[0], **t[1]}
)


def _check(r: httpx.Response, also: tuple[int, ...] = ()) -> None:
    assert r.status_code in (200, 400, 404, 413, 422, 429, *also), (r.status_code, r.text)
    if r.status_code != 200:
        assert isinstance(r.json()["error"]["message"], str)
    elif r.headers["content-type"].startswith("text/event-stream"):
        sse_events(r.text.splitlines())
    else:
        assert r.json()["choices"]


@settings(max_examples=220, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, chat=st.booleans())
def test_fuzzed_json_bodies(http, body, chat):
    raw = json.dumps(body).encode()  # NaN and infinity too (not JSON: the server must refuse them)
    _check(http.post("/v1/chat/completions" if chat else "/v1/completions", content=raw))


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    raw=st.binary(max_size=200)
    | st.text(max_size=200).map(str.encode)
    | json_values.map(lambda v: json.dumps(v).encode()),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/health"]),
)
def test_fuzzed_raw_bodies(http, raw, path):
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code != 200 or path.endswith("completions")  # a valid body by chance is fine
    assert r.status_code != 405 or not path.endswith("completions")
    _check(r, also=(405,))


def test_still_serving_after_fuzz(server, http):
    valid_request_succeeds(http)
    wait_idle(server.url)


def test_sigterm_drains_in_flight_streams():
    proc = ServerProcess("--method", "none")
    try:
        proc.wait_ready()
        body = {
            "prompt": "class Stack:",
            "max_tokens": 48,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with (
            httpx.Client(base_url=proc.url, timeout=120) as c,
            c.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            proc.proc.terminate()  # SIGTERM mid-stream
            events = [json.loads(first[6:])] + sse_events(lines)
        _, finish = stream_text(events)
        assert finish == "length" and events[-1]["usage"]["completion_tokens"] == 48
        assert proc.proc.wait(60) == 0, proc.output()
        assert "engine stopped" in proc.output()
    finally:
        proc.close()
