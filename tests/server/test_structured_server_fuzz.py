"""Structured output fuzzed through the OpenAI server (zoo/tinypy drafting with its EAGLE3 draft): every bad
constraint, in whichever field vLLM takes it, is a 400 naming that field; a constraint that runs into a dead end
part-way is that request's error alone; good requests sent at the same time answer as they do alone, and the server
is left holding nothing. Also ``build_app`` refuses a ``log_interval`` that would never log."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

for _dependency in ("fastapi", "uvicorn", "xgrammar"):
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")

from helpers.server_helpers import in_thread  # noqa: E402
from outpace.config import EngineConfig, SpeculativeConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402
from outpace.validation import ConfigError  # noqa: E402

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def _nested(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


# (the body's constraint, the param the 400 names, what its message says)
REFUSED = [
    ({"structured_outputs": {"choice": "yes"}}, "structured_outputs.choice", "array"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly"),
    ({"structured_outputs": {"regex": "a("}}, "structured_outputs.regex", "parenthesis"),
    ({"guided_json": {"$ref": "#"}}, "guided_json", "no output satisfies it"),
    ({"guided_regex": "[^\\x00-\\U0010FFFF]"}, "guided_regex", "no output satisfies it"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar", "EBNF"),
    ({"guided_choice": []}, "guided_choice", "at least 1"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "both constrain"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": _nested(150)}}},
        "response_format.json_schema.schema",
        "nests more than 100 levels",
    ),
    (
        {"structured_outputs": {"json": '{"items": ' * 5000 + "{}" + "}" * 5000}},
        "structured_outputs.json",
        "nests more than 100 levels",
    ),
    (
        {"guided_json": {"type": "string", "pattern": "[a-z]{3000}"}},
        "guided_json",
        "internal check",
    ),
]
# (prompt, the body's other fields): answered the same alone and among the bad requests
GOOD = [
    ("def add(a, b):\n", {}),
    ("answer = ", {"guided_choice": ["yes", "no", "maybe"], "n": 2}),
    ("x = ", {"structured_outputs": {"json": {}}}),  # any value: used to hang its connection
    ("d = ", {"response_format": {"type": "json_object"}}),
    ("n = ", {"guided_regex": "[0-9]{2,6}", "best_of": 3, "temperature": 1.0, "seed": 7}),
]
_NO_CHARACTER = "[^\\x00-\\U0010FFFF]"  # a class no character is in
DEAD_END = {"guided_regex": "ab" + _NO_CHARACTER}  # no token continues it after "ab"


@pytest.fixture
def app():  # (one per test: a served app stops its engine when it stops)
    spec = SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3)
    config = EngineConfig(
        str(ZOO / "tinypy"), device="cpu", max_num_seqs=8, num_kv_blocks=128, speculative=spec
    )
    return build_app(config, log_interval=60)


def _body(prompt: str, fields: dict) -> dict:
    return {"prompt": prompt, "max_tokens": 12, "temperature": 0, **fields}


async def _post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))


def _texts(response: httpx.Response) -> list[tuple[str, str]]:
    assert response.status_code == 200, response.text
    return [(c["text"], c["finish_reason"]) for c in response.json()["choices"]]


def test_bad_constraints_among_good_requests(app):
    good = [_body(p, f) for p, f in GOOD]
    bad = [_body("x = ", c) for c, _, _ in REFUSED] + [_body("x = ", DEAD_END)]
    with in_thread(app) as url:
        alone = [_texts(r) for b in good for r in asyncio.run(_post_all(url, [b]))]
        answers = asyncio.run(_post_all(url, bad[:4] + good + bad[4:]))
        health = httpx.get(url + "/health").json()
    together = answers[4 : 4 + len(good)]
    assert [_texts(r) for r in together] == alone
    for response, (constraint, param, says) in zip(answers[:4] + answers[4 + len(good) :], REFUSED):
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param, (constraint, error)
        assert says in error["message"], (constraint, error)
        assert ".cc:" not in error["message"] and "Check failed" not in error["message"]
    dead = answers[-1]
    assert dead.status_code == 500, dead.text
    assert "guided_regex allows no token after" in dead.json()["error"]["message"]
    assert health["num_requests_unfinished"] == 0
    assert health["kv_blocks_free"] == health["kv_blocks_total"]
    assert len(app.state.engine.engine.grammars) == 0


_DEAD_STRING = {
    "type": "string",
    "pattern": "ab[^\\s\\S]",
}  # (the same in a schema's ECMA-262 pattern)


# (a constraint in each field that takes one, the field a dead end's message names)
DEAD_ENDS = [
    (DEAD_END, "guided_regex"),
    ({"structured_outputs": {"regex": "ab" + _NO_CHARACTER}}, "structured_outputs.regex"),
    ({"guided_json": _DEAD_STRING}, "guided_json"),
    ({"guided_grammar": f'root ::= "ab" {_NO_CHARACTER}'}, "guided_grammar"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": _DEAD_STRING}}},
        "response_format.json_schema.schema",
    ),
]


def _error(response: httpx.Response, stream: bool) -> dict:
    """The error a failed request answers with: a 500's body, or a stream's error event (before ``[DONE]``)."""
    if not stream:
        assert response.status_code == 500, response.text
        return response.json()["error"]
    events = [e[len("data: ") :] for e in response.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]", response.text
    return json.loads(events[-2])["error"]


def test_a_dead_end_names_the_field_the_request_used(app):
    """A grammar's dead end fails its request with a message naming the field that set the constraint (it named
    ``structured_outputs.<kind>`` whatever the field), in a JSON answer and in a stream's error event."""
    cases = [(c, param, stream) for c, param in DEAD_ENDS for stream in (False, True)]
    bodies = [{**_body("x = ", c), "stream": stream} for c, _, stream in cases]
    with in_thread(app) as url:
        answers = asyncio.run(_post_all(url, bodies))
    for response, (constraint, param, stream) in zip(answers, cases):
        error = _error(response, stream)
        assert f"GrammarDeadEnd: {param} allows no token after" in error["message"], (
            constraint,
            error,
        )


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0, 0, True])
def test_a_log_interval_that_never_logs_is_refused(value):
    """As ``--log-interval`` is (cli/serve.py ``positive_seconds``): inf used to be taken, and never logged."""
    with pytest.raises(ConfigError, match=r"server log_interval=.* finite number of seconds > 0"):
        build_app(EngineConfig(str(ZOO / "tinypy"), device="cpu"), log_interval=value)
