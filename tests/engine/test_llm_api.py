"""The offline API's vLLM-shaped surface: n and best_of, LLM.chat with the tokenizer's chat template."""

import os

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.validation import ConfigError

ZOO = "zoo/"
# fp32 on the CPU by default; OUTPACE_TEST_DEVICE=cuda runs the same checks on a GPU
DEVICE = os.environ.get("OUTPACE_TEST_DEVICE", "cpu")


@pytest.fixture(scope="module")
def llm():
    return LLM(
        ZOO + "tinypy",
        device=DEVICE,
        dtype="float32",
        num_kv_blocks=256,
        max_num_seqs=16,
        speculative=SpeculativeConfig("eagle3", ZOO + "tinypy-eagle3", num_steps=3),
    )


def test_n_completions_per_prompt(llm):
    outs = llm.generate(
        ["def add(a, b):\n", "x = "], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12)
    )
    assert len(outs) == 2
    for out in outs:
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1, (
            "seeds seed + i give distinct samples"
        )
        assert out.text == out.outputs[0].text and out.token_ids == out.outputs[0].token_ids
    # completion i is the request with seed + i
    second = llm.generate("x = ", SamplingParams(temperature=1.0, seed=6, max_tokens=12))[0]
    assert outs[1].outputs[1].token_ids == second.token_ids
    greedy = llm.generate("x = ", SamplingParams(n=2, temperature=0, max_tokens=8))[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids


def test_best_of_keeps_the_most_likely(llm):
    params = SamplingParams(n=2, best_of=4, temperature=1.0, seed=11, max_tokens=10)
    best = llm.generate("import ", params)[0]
    assert len(best.outputs) == 2
    # not asked for: ranking used them, but the user sees neither them nor their sum (vLLM: None)
    assert all(c.logprobs is None and c.cumulative_logprob is None for c in best.outputs)
    assert best.logprobs is None and best.cumulative_logprob is None
    every = llm.generate("import ", params.replace(n=4, best_of=None, logprobs=0))[0]
    ranked = sorted(every.outputs, key=lambda c: c.cumulative_logprob, reverse=True)
    assert [c.token_ids for c in best.outputs] == [c.token_ids for c in ranked[:2]]
    shown = llm.generate("import ", params.replace(logprobs=0))[0]  # asked for: shown, best first
    assert [c.cumulative_logprob for c in shown.outputs] == [
        c.cumulative_logprob for c in ranked[:2]
    ]
    assert shown.cumulative_logprob == shown.outputs[0].cumulative_logprob


def test_chat_uses_the_chat_template(llm):
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Sort a list."},
    ]
    params = SamplingParams(temperature=0, max_tokens=12)
    out = llm.chat(messages, params)[0]
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n")
    assert out.prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)
    assert out.token_ids == llm.generate([out.prompt_token_ids], params)[0].token_ids
    assert len(llm.chat([messages, messages[1:]], params)) == 2
    with pytest.raises(ValueError, match="conversation 0 must be"):
        llm.chat([[{"role": "user"}]], params)


def test_chat_names_the_conversation_whose_messages_the_template_refuses(llm):
    """A template's raise_exception (tinypy's for a role it lacks) was jinja's TemplateError, no ValueError,
    naming no conversation; vLLM's LLM.chat raises a ValueError of the template's text."""
    ok = [{"role": "user", "content": "hi"}]
    with pytest.raises(
        ValueError, match="conversation 1: the chat template refused .*unknown chat role: tool"
    ):
        llm.chat([ok, [*ok, {"role": "tool", "content": "x"}]], SamplingParams(max_tokens=1))


def test_n_and_best_of_are_checked_by_name(llm):
    with pytest.raises(ConfigError, match="SamplingParams.best_of=1"):
        SamplingParams(n=2, best_of=1)
    with pytest.raises(ConfigError, match="SamplingParams.n=0"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="an engine request is one sequence"):
        llm.engine.add_request("x", SamplingParams(n=2))
    assert not llm.engine.has_unfinished_requests


def test_server_structured_output_logprobs_penalties_best_of():
    """The OpenAI server maps response_format, logprobs, penalties, logit_bias and best_of onto the
    engine (with speculation on) and answers in OpenAI's shapes; what it cannot do is a 400 by name."""
    pytest.importorskip("fastapi")
    pytest.importorskip("xgrammar")
    import json

    from fastapi.testclient import TestClient

    from outpace.config import EngineConfig
    from outpace.server.app import build_app

    config = EngineConfig(
        ZOO + "tinypy",
        device=DEVICE,
        dtype="float32",
        num_kv_blocks=256,
        max_num_seqs=8,
        speculative=SpeculativeConfig("eagle3", ZOO + "tinypy-eagle3", num_steps=3),
    )
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
    }
    with TestClient(build_app(config, log_interval=1e9)) as http:
        r = http.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "a number"}],
                "max_tokens": 20,
                "temperature": 0.7,
                "seed": 1,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": schema},
                },
                "logprobs": True,
                "top_logprobs": 2,
                "frequency_penalty": 0.5,
                "logit_bias": {"272": -3},
            },
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert 0 <= json.loads(choice["message"]["content"])["n"] <= 9
        content = choice["logprobs"]["content"]
        assert len(content) == r.json()["usage"]["completion_tokens"]
        assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
        r = http.post(
            "/v1/completions",
            json={
                "prompt": "def f(x):",
                "max_tokens": 6,
                "temperature": 1.0,
                "seed": 3,
                "n": 2,
                "best_of": 3,
                "logprobs": 1,
                "repetition_penalty": 1.2,
            },
        )
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        assert len(choices) == 2 and [c["index"] for c in choices] == [0, 1]
        sums = [sum(c["logprobs"]["token_logprobs"]) for c in choices]
        assert sums[0] >= sums[1] and all(
            len(c["logprobs"]["tokens"]) == len(c["logprobs"]["top_logprobs"]) for c in choices
        )
        for body, param in (
            ({"response_format": {"type": "yaml"}}, "response_format"),
            ({"logprobs": 21}, "logprobs"),
            ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json"),
            ({"logit_bias": {"x": 1}}, "logit_bias"),
        ):
            r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
