"""vLLM's /tokenize, /detokenize and /v1/models as a client of vLLM sends and reads them: the chat form's
``continue_final_message``, the model card's ``parent`` and ``permission``, and bad input of every kind answered
with a 400 naming its field while the server keeps serving."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402

TINYPY = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")
VOCAB = 4096  # zoo/tinypy/config.json
USER = [{"role": "user", "content": "hi"}]
PREFILL = [*USER, {"role": "assistant", "content": "def f("}]


@pytest.fixture(scope="module")
def http():
    config = EngineConfig(TINYPY, device="cpu", max_num_seqs=2)
    with TestClient(build_app(config, log_interval=1e9), raise_server_exceptions=False) as client:
        yield client


def test_tokenize_continue_final_message_ends_inside_the_last_message(http):
    tok = http.app.state.engine.tokenizer
    body = {"messages": PREFILL, "continue_final_message": True, "add_generation_prompt": False}
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    text = tok.apply_chat_template(
        PREFILL, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    assert text.endswith("def f(")
    assert r.json()["tokens"] == tok.encode(text, add_special_tokens=False)
    closed = http.post("/tokenize", json={"messages": PREFILL, "add_generation_prompt": False})
    assert closed.json()["tokens"] != r.json()["tokens"]


@pytest.mark.parametrize(
    "body",
    [
        {
            "messages": PREFILL,
            "continue_final_message": True,
        },  # add_generation_prompt: true by default
        {"messages": PREFILL, "continue_final_message": True, "add_generation_prompt": True},
        {"prompt": "x", "continue_final_message": True},
    ],
)
def test_tokenize_continue_final_message_refused_where_it_cannot_apply(http, body):
    r = http.post("/tokenize", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_model_card_has_vllm_fields(http):
    listed = http.get("/v1/models").json()["data"]
    card = http.get("/v1/models/tinypy").json()
    assert listed == [card]
    assert card["parent"] is None and card["max_model_len"] > 0
    [perm] = card["permission"]
    assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")
    assert perm["allow_sampling"] and perm["allow_logprobs"] and perm["organization"] == "*"


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/tokenize", {"prompt": "x", "foo": 1}, 400, "foo"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"prompt": [1, 2]}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": [{"content": "x"}]}, 400, "messages.0.role"),
        (
            "/tokenize",
            {"messages": USER, "add_generation_prompt": "x"},
            400,
            "add_generation_prompt",
        ),
        # (a chat field beside a prompt means nothing: refused, not ignored)
        (
            "/tokenize",
            {"prompt": "x", "add_generation_prompt": False},
            400,
            "add_generation_prompt",
        ),
        (
            "/tokenize",
            {"prompt": "x", "continue_final_message": False},
            400,
            "continue_final_message",
        ),
        ("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
        ("/detokenize", {"tokens": [VOCAB]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": [2**40]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": [1.5]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": "1"}, 400, "tokens"),
        ("/detokenize", {"tokens": [1], "x": 1}, 400, "x"),
        ("/detokenize", {"tokens": [1], "model": "gpt-4"}, 404, "model"),
    ],
)
def test_bad_input_is_refused_by_field_and_the_server_keeps_serving(
    http, path, body, status, param
):
    r = http.post(path, json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert http.post("/tokenize", json={"prompt": "x"}).json()["count"] == 1


def test_valid_shapes_and_edges(http):
    tok = http.app.state.engine.tokenizer
    assert http.post("/tokenize", json={"prompt": ""}).json()["tokens"] == []
    r = http.post("/tokenize", json={"prompt": "hello", "return_token_strs": True}).json()
    assert set(r) == {"count", "max_model_len", "tokens", "token_strs"}
    assert r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"]) and r["count"] == len(
        r["tokens"]
    )
    ids = list(range(VOCAB - 3, VOCAB)) * 20000  # 60k ids
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": tok.decode(ids)}
    assert http.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}
    assert http.get("/version").json()["version"] and http.get("/health").status_code == 200


def test_a_template_that_raises_is_a_400_naming_messages_with_its_text(http):
    """tinypy's template raises (raise_exception) for a role it lacks: the template's text reaches the client as
    a 400 on ``messages``, never a 500, on the chat route and the chat form of /tokenize alike."""
    messages = [{"role": "critic", "content": "hi"}]
    for route, body in (("/v1/chat/completions", {"max_tokens": 1}), ("/tokenize", {})):
        r = http.post(route, json={"messages": messages, **body})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages", error
        assert (
            "the chat template refused the messages: unknown chat role: critic" in error["message"]
        )
