"""Request fields as clients send them (found by fuzzing the server): a null field takes its default, as OpenAI's
API and vLLM's request models allow; a sampling parameter the engine refuses is named in the 400's ``param``
(not the prompt); a text content part without its text says so."""

from __future__ import annotations

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
