"""What a vLLM user types, against a real ``outpace serve`` of the zoo model with its EAGLE3 draft (the
default): logprobs in streams, lm-evaluation-harness's loglikelihood request (echo + logprobs on token
ids), the older ``guided_*`` fields, ``continuous_usage_stats``, values as pydantic's lax mode reads
them, vLLM's ``seed: -1``, /version, /tokenize and /detokenize, fields the server does not implement
refused by name, and errors naming the field at fault without showing internals."""

import json
import re

import pytest

for _dependency in ("fastapi", "uvicorn", "prometheus_client", "xgrammar"):
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")

import outpace  # noqa: E402
from helpers.server_helpers import (  # noqa: E402
    PROMPTS,
    chat_prompt_ids,
    offline_llm,
    serving,
    sse_events,
    stream_text,
)
from outpace.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402

MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
}


@pytest.fixture(scope="module")
def server():
    yield from serving()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def llm():
    return offline_llm()


def post(http, path: str, body: dict) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.iter_lines())


def refused(http, path: str, body: dict) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_streamed_completion_logprobs_equal_the_whole_answer(http):
    body = {"prompt": PROMPTS[0][:80], "max_tokens": 12, "temperature": 0, "logprobs": 2}
    whole = post(http, "/v1/completions", body)["choices"][0]
    events = streamed(http, "/v1/completions", body)
    parts = [c["logprobs"] for e in events for c in e["choices"] if c["logprobs"]]
    joined = {
        k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs")
    }
    assert joined["tokens"] == whole["logprobs"]["tokens"] and len(joined["tokens"]) == 12
    assert joined["token_logprobs"] == pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-4)
    assert [list(top) for top in joined["top_logprobs"]] == [
        list(top) for top in whole["logprobs"]["top_logprobs"]
    ]
    assert stream_text(events)[0] == whole["text"]


def test_streamed_chat_logprobs_equal_the_whole_answer(http):
    body = {
        "messages": MESSAGES,
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = post(http, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]
    events = streamed(http, "/v1/chat/completions", body)
    content = [
        x for e in events for c in e["choices"] if c["logprobs"] for x in c["logprobs"]["content"]
    ]
    assert [x["token"] for x in content] == [x["token"] for x in whole] and len(content) == 10
    assert [x["logprob"] for x in content] == pytest.approx([x["logprob"] for x in whole], abs=1e-4)
    assert all(len(x["top_logprobs"]) == 2 for x in content)


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_loglikelihood_request_of_lm_evaluation_harness(http, llm, max_tokens):
    """lm-evaluation-harness's local-completions sends token ids with echo, logprobs 1 and max_tokens 1,
    and reads token_logprobs[ctxlen:-1] and top_logprobs[ctxlen:-1]; vLLM answers max_tokens 0 with the
    prompt alone. The prompt's log-probabilities are the offline engine's, the first one null."""
    tok = llm.tokenizer
    ids = tok.encode(PROMPTS[2][:120])
    ctxlen = len(ids) - 6
    ref = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))[0]
    body = {
        "model": "tinypy",
        "prompt": [ids],
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    r = post(http, "/v1/completions", body)
    lp = r["choices"][0]["logprobs"]
    assert (
        len(lp["tokens"])
        == len(lp["token_logprobs"])
        == len(lp["top_logprobs"])
        == len(ids) + max_tokens
    )
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][: len(ids)] == [tok.decode([t]) for t in ids]
    want = [e[t].logprob for t, e in zip(ids[1:], ref.prompt_logprobs[1:])]
    assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want, abs=1e-4)
    for t, e, top in zip(ids[1:], ref.prompt_logprobs[1:], lp["top_logprobs"][1 : len(ids)]):
        assert len(top) in (1, 2) and tok.decode([t]) in top  # the token itself and the most likely
        greedy = e[t].rank == 1
        assert greedy == (top[tok.decode([t])] == max(top.values()))
    assert r["choices"][0]["text"].startswith(tok.decode(ids))
    assert r["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": max_tokens,
        "total_tokens": len(ids) + max_tokens,
    }
    if (
        max_tokens
    ):  # the harness's reading: the continuation's log-probabilities, less the token made
        continuation = lp["token_logprobs"][ctxlen:-1]
        assert sum(continuation) == pytest.approx(sum(want[ctxlen - 1 :]), abs=1e-3)
    else:
        assert r["choices"][0]["text"] == tok.decode(ids)
        assert r["choices"][0]["finish_reason"] == "length"


def test_echo_with_logprobs_streams_the_prompt_first(http, llm):
    ids = llm.tokenizer.encode(PROMPTS[3][:60])
    body = {"prompt": ids, "temperature": 0, "max_tokens": 3, "logprobs": 1, "echo": True}
    events = streamed(http, "/v1/completions", body)
    first = events[0]["choices"][0]
    assert first["text"] == llm.tokenizer.decode(ids)
    assert (
        len(first["logprobs"]["tokens"]) == len(ids)
        and first["logprobs"]["token_logprobs"][0] is None
    )
    rest = [c["logprobs"] for e in events[1:] for c in e["choices"] if c["logprobs"]]
    assert sum(len(p["tokens"]) for p in rest) == 3


CONSTRAINTS = [  # (the older vLLM field, its structured_outputs form, whether an output obeys it)
    ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    (
        {"guided_regex": "[a-z]{3}[0-9]"},
        {"regex": "[a-z]{3}[0-9]"},
        lambda t: re.fullmatch("[a-z]{3}[0-9]", t),
    ),
    ({"guided_json": SCHEMA}, {"json": SCHEMA}, lambda t: 0 <= json.loads(t)["n"] <= 99),
    (
        {"guided_grammar": 'root ::= "x" [0-9] [0-9]'},
        {"grammar": 'root ::= "x" [0-9] [0-9]'},
        lambda t: re.fullmatch("x[0-9][0-9]", t),
    ),
]


@pytest.mark.parametrize(
    "guided,structured,obeys", CONSTRAINTS, ids=["choice", "regex", "json", "grammar"]
)
def test_guided_fields_constrain_as_structured_outputs(http, guided, structured, obeys):
    base = {"prompt": "answer = ", "max_tokens": 16, "temperature": 0}
    text = post(http, "/v1/completions", {**base, **guided})["choices"][0]["text"]
    assert obeys(text), text
    assert (
        text
        == post(http, "/v1/completions", {**base, "structured_outputs": structured})["choices"][0][
            "text"
        ]
    )
    chat = {"messages": MESSAGES, "max_tokens": 16, "temperature": 0, **guided}
    assert obeys(post(http, "/v1/chat/completions", chat)["choices"][0]["message"]["content"])


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"frobnicate": True}, "frobnicate"),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
        (
            {"stream": True, "stream_options": {"include_usage": True, "every": 2}},
            "stream_options.every",
        ),
    ],
)
def test_fields_not_implemented_are_refused_by_name(http, extra, param):
    err = refused(http, "/v1/completions", {"prompt": "x", "max_tokens": 2, **extra})
    assert (
        err["param"] == param and param in err["message"] and err["code"] == "unsupported_parameter"
    )


def test_null_and_neutral_fields_are_accepted(http):
    post(
        http,
        "/v1/completions",
        {
            "prompt": "x",
            "max_tokens": 2,
            "frobnicate": None,
            "min_tokens": 0,
            "skip_special_tokens": True,
            "guided_decoding_backend": "xgrammar",
        },
    )
    messages = [{"role": "user", "content": "hi", "tool_calls": None}]
    post(http, "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    messages[0]["tool_calls"] = [{"id": "call-1"}]  # (no function)
    assert (
        refused(http, "/v1/chat/completions", {"messages": messages})["param"]
        == "messages.0.tool_calls.0.function"
    )


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_put_usage_on_every_chunk(http, llm, chat):
    body = {
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    if chat:
        path, body, prompt_tokens = (
            "/v1/chat/completions",
            {**body, "messages": MESSAGES},
            len(chat_prompt_ids(llm, MESSAGES)),
        )
    else:
        path, body = "/v1/completions", {**body, "prompt": "def f(x):"}
        prompt_tokens = len(llm.tokenizer.encode("def f(x):"))
    events = streamed(http, path, body)
    assert all(e["usage"]["prompt_tokens"] == prompt_tokens for e in events)
    counts = [e["usage"]["completion_tokens"] for e in events if e["choices"]]
    assert counts == sorted(counts) and counts[-1] == 8 and len(counts) > 2
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8


def test_values_as_vllm_reads_them(http):
    for max_tokens in ("5", 5.0):
        body = {
            "prompt": "def f(x):",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        assert post(http, "/v1/completions", body)["usage"]["completion_tokens"] == 5
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": "true"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    sse_events(r.text.splitlines())
    post(http, "/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 1, "seed": -1})
    for bad in ({"max_tokens": 2.5}, {"max_tokens": "five"}, {"stream": "maybe"}, {"seed": -2}):
        assert refused(http, "/v1/completions", {"prompt": "x", **bad})["param"] == next(iter(bad))


def test_min_tokens_stop_strings_kept_and_special_tokens_as_vllm_reads_them(http, llm):
    """``min_tokens`` holds back the end of sequence a bias favours (and is refused past ``max_tokens``, by name);
    ``include_stop_str_in_output`` keeps the stop string; ``skip_special_tokens`` false shows special tokens;
    ``allowed_token_ids`` bounds the tokens sampled."""
    eos = llm.engine.model_config.eos_token_ids[0]
    body = {"prompt": "def f(x):", "max_tokens": 12, "temperature": 0, "logit_bias": {str(eos): 60}}
    assert post(http, "/v1/completions", body)["usage"]["completion_tokens"] == 1
    held = post(http, "/v1/completions", {**body, "min_tokens": 5})
    assert held["usage"]["completion_tokens"] == 6 and held["choices"][0]["finish_reason"] == "stop"
    err = refused(http, "/v1/completions", {**body, "min_tokens": 13})
    assert err["param"] == "min_tokens" and "max_tokens=12" in err["message"]
    plain = {"prompt": "def f(x):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    text = post(http, "/v1/completions", plain)["choices"][0]["text"]
    stop = next(c for c in text if c.strip())
    kept = post(
        http, "/v1/completions", {**plain, "stop": [stop], "include_stop_str_in_output": True}
    )
    assert kept["choices"][0]["text"] == text[: text.index(stop) + 1]
    special = {**plain, "max_tokens": 2, "logit_bias": {"5": 60}}  # zoo/tinypy's <|assistant|>
    assert post(http, "/v1/completions", special)["choices"][0]["text"] == ""
    shown = post(http, "/v1/completions", {**special, "skip_special_tokens": False})
    assert shown["choices"][0]["text"] == "<|assistant|>" * 2
    allowed = post(http, "/v1/completions", {**plain, "allowed_token_ids": [40, 41], "logprobs": 1})
    tokens = allowed["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == 12 and set(tokens) <= {llm.tokenizer.decode([t]) for t in (40, 41)}
    err = refused(http, "/v1/completions", {**plain, "allowed_token_ids": []})
    assert err["param"] == "allowed_token_ids"


def test_version_tokenize_detokenize(http, llm):
    tok = llm.tokenizer
    assert http.get("/version").json() == {"version": outpace.__version__}
    max_model_len = http.get("/v1/models").json()["data"][0]["max_model_len"]
    text = "def f(x):\n    return x + 1"
    ids = tok.encode(text, add_special_tokens=True)
    assert post(http, "/tokenize", {"prompt": text}) == {
        "count": len(ids),
        "max_model_len": max_model_len,
        "tokens": ids,
        "token_strs": None,
    }
    plain = tok.encode(text, add_special_tokens=False)
    r = post(
        http,
        "/tokenize",
        {"model": "tinypy", "prompt": text, "add_special_tokens": False, "return_token_strs": True},
    )
    assert r["tokens"] == plain and r["token_strs"] == tok.convert_ids_to_tokens(plain)
    assert post(http, "/tokenize", {"messages": MESSAGES})["tokens"] == chat_prompt_ids(
        llm, MESSAGES
    )
    assert post(http, "/detokenize", {"tokens": ids}) == {"prompt": tok.decode(ids)}
    assert refused(http, "/detokenize", {"tokens": [10**9]})["param"] == "tokens"
    assert refused(http, "/tokenize", {"prompt": "x", "messages": MESSAGES})["param"] == "prompt"


BAD_CONSTRAINTS = [  # (chat?, the constraint, the field the error names)
    (False, {"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex"),
    (False, {"guided_regex": "a(b"}, "guided_regex"),
    (False, {"guided_json": 5}, "guided_json"),
    (
        True,
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "wat"}},
            }
        },
        "response_format.json_schema.schema",
    ),
    (True, {"guided_json": {"$ref": "#/$defs/missing"}}, "guided_json"),
    (
        False,
        {
            "structured_outputs": {
                "json": {
                    "type": "object",
                    "properties": {"a": {"$ref": "https://x.org/a.json"}},
                    "required": ["a"],
                }
            }
        },
        "structured_outputs.json",
    ),
    (False, {"guided_json": {"$ref": "#anchor"}}, "guided_json"),
    (False, {"structured_outputs": {"regex": "a", "pattern": "b"}}, "structured_outputs.pattern"),
    (False, {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    (False, {"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    (
        False,
        {"guided_regex": "a", "guided_decoding_backend": "outlines"},
        "guided_decoding_backend",
    ),
]


@pytest.mark.parametrize("chat,constraint,param", BAD_CONSTRAINTS)
def test_constraint_errors_name_their_field_without_internals(http, chat, constraint, param):
    body = {"messages": MESSAGES} if chat else {"prompt": "x"}
    err = refused(
        http,
        "/v1/chat/completions" if chat else "/v1/completions",
        {**body, "max_tokens": 4, **constraint},
    )
    assert err["param"] == param, err
    for internal in ("/project/", ".cc:", "__init__", "keyword argument", "Check failed"):
        assert internal not in err["message"], err


def test_unresolvable_ref_is_refused_offline_too(llm):
    for schema in (
        {"$ref": "other.json"},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}},
    ):
        with pytest.raises(
            ValueError, match="structured_outputs.json does not compile: .*cannot be resolved"
        ):
            llm.generate(
                "x = ",
                SamplingParams(
                    max_tokens=4, structured_outputs=StructuredOutputsParams(json=schema)
                ),
            )
    schema = {
        "$ref": "#/$defs/N",
        "$defs": {"N": SCHEMA},
    }  # a reference inside the schema is followed
    out = llm.generate(
        "x = ",
        SamplingParams(
            temperature=0, max_tokens=16, structured_outputs=StructuredOutputsParams(json=schema)
        ),
    )[0]
    assert 0 <= json.loads(out.text)["n"] <= 99
