"""An answer cut inside a character: the zoo's tinypy writes a non-ASCII character byte by byte, so max_tokens or a
stop token can end it after the character's first bytes. Like vLLM's, the answer (whole, and its stream's last
delta) then leaves that unfinished character out instead of ending in U+FFFD; a U+FFFD the model wrote whole (the
character's three bytes) stays inside the text. The log-probabilities keep every token's own text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402

TINYPY = str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")


@pytest.fixture(scope="module")
def http():
    config = EngineConfig(TINYPY, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=4)
    with TestClient(build_app(config, log_interval=1e9)) as client:
        yield client


def byte_tokens(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()[
        "tokens"
    ]


def answer(http, chat: bool, **body) -> tuple[dict, str, str]:
    """The whole answer's choice, and the streamed text and finish reason, of a greedy request."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "x"}
    body = {**prompt, "temperature": 0, **body}
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text, finish = "", None
    with http.stream("POST", path, json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    text += (c["delta"].get("content") or "") if chat else c["text"]
                    finish = c["finish_reason"] or finish
    return choice, text, finish


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    "written, max_tokens, expected",
    [("é", 1, ""), ("aé", 2, "a"), ("中文", 4, "中"), ("中", 2, ""), ("x\ufffd", 3, "x")],
)
def test_a_character_cut_by_max_tokens_is_left_out(http, chat, written, max_tokens, expected):
    assert len(byte_tokens(http, written)) > max_tokens  # (cut inside its last character)
    body = {"guided_choice": [written], "max_tokens": max_tokens, "logprobs": not chat}
    choice, streamed, finish = answer(http, chat, **body)
    text = choice["message"]["content"] if chat else choice["text"]
    assert (text or "") == streamed == expected and choice["finish_reason"] == finish == "length"
    if not chat:  # (each token's text, as vLLM shows it: a byte alone is U+FFFD)
        assert len(choice["logprobs"]["tokens"]) == max_tokens


def test_a_character_cut_by_a_stop_token_is_left_out(http):
    """The stop token (not in the text) is the character's last byte: the text ends with the bytes before it."""
    last = byte_tokens(http, "é")[-1]
    choice, streamed, finish = answer(http, False, guided_choice=["aé"], stop_token_ids=[last])
    assert choice["text"] == streamed == "a" and choice["stop_reason"] == last
    assert choice["finish_reason"] == finish == "stop"


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("written, expected", [("x\ufffdy", "x\ufffdy"), ("x\ufffd", "x")])
def test_a_replacement_character_written_whole_stays_inside_the_text(http, chat, written, expected):
    """At the text's end it is held back as an unfinished character is: vLLM's detokenizer (tokenizers'
    DecodeStream) lets out no text that ends in U+FFFD."""
    choice, streamed, finish = answer(http, chat, guided_choice=[written], max_tokens=8)
    text = choice["message"]["content"] if chat else choice["text"]
    assert text == streamed == expected and choice["finish_reason"] == finish == "stop"
