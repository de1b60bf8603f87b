"""The model's generation_config.json gives the sampling defaults of every request field left unset, as vLLM's
default ``--generation-config auto`` does (outpace/generation_defaults.py): a request's own value wins,
``--generation-config vllm`` ignores the file, ``--override-generation-config`` sets keys over it, and a bad value
is refused at start-up naming the file and the field."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from helpers.generation_config_dirs import tinypy_with_generation_config  # noqa: E402
from outpace.config import EngineConfig  # noqa: E402
from outpace.server.app import build_app  # noqa: E402
from outpace.validation import ConfigError  # noqa: E402

# greedy, and a chat's answer 3 tokens long, unless the request says otherwise
FILE = {"temperature": 0.0, "max_new_tokens": 3, "do_sample": True, "eos_token_id": 0}
PROMPT = "def fibonacci(n):"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tinypy_with_generation_config(tmp_path_factory.mktemp("gen") / "tinypy", FILE)


def serve(model: str, **config) -> TestClient:
    return TestClient(build_app(EngineConfig(model, device="cpu", **config), log_interval=1e9))


def completion(http, **fields) -> tuple[str, int]:
    body = {"prompt": PROMPT, "seed": 1, "ignore_eos": True, **fields}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"], r.json()["usage"]["completion_tokens"]


def chat_tokens(http, **fields) -> int:
    r = http.post("/v1/chat/completions", json={"messages": USER, "ignore_eos": True, **fields})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["completion_tokens"]


def test_unset_fields_take_the_files_defaults_and_given_ones_win(model):
    with serve(model) as http:
        greedy = completion(http, max_tokens=8, temperature=0)
        sampled = completion(http, max_tokens=8, temperature=1.0)
        assert sampled != greedy  # (seed 1 samples other tokens than greedy at temperature 1)
        assert completion(http, max_tokens=8) == greedy  # the file's temperature 0
        assert chat_tokens(http) == 3  # the file's max_new_tokens
        assert chat_tokens(http, max_tokens=5) == chat_tokens(http, max_completion_tokens=5) == 5
        assert completion(http)[1] == 16  # a completion's default stays OpenAI's 16, as in vLLM


def test_generation_config_vllm_ignores_the_file_and_the_override_sets_keys(model):
    # vllm: no file, only the override; an override's max_new_tokens also caps a given max_tokens (vLLM's
    # override_max_tokens)
    with serve(
        model, generation_config="vllm", override_generation_config={"max_new_tokens": 2}
    ) as http:
        sampled = completion(http, max_tokens=8, temperature=1.0)
        assert completion(http, max_tokens=8) == sampled  # temperature 1, not the file's 0
        assert chat_tokens(http) == 2 and chat_tokens(http, max_tokens=5) == 2
    # auto: the override's keys win over the file's, its other keys stay
    with serve(model, override_generation_config={"max_new_tokens": 5}) as http:
        assert chat_tokens(http) == 5
        assert completion(http, max_tokens=8) == completion(http, max_tokens=8, temperature=0)


def test_a_bad_value_is_refused_naming_the_file_and_the_field(tmp_path):
    model = tinypy_with_generation_config(tmp_path / "tinypy", {"temperature": "hot", "top_k": 20})
    path = re.escape(f"{model}/generation_config.json")
    with pytest.raises(
        ConfigError, match=f"^{path}: field 'temperature' must be a number, got 'hot'"
    ):
        build_app(EngineConfig(model, device="cpu"))
    with pytest.raises(
        ConfigError, match="^--override-generation-config: field 'top_p' must be in"
    ):
        build_app(
            EngineConfig(model, generation_config="vllm", override_generation_config={"top_p": 2})
        )
