"""The OpenAI-compatible server, as a real process on 127.0.0.1 with the zoo target and its EAGLE3
draft (the default): the official openai client, 200 concurrent streams, client disconnects, and
/metrics agreeing with the responses' own speculative metrics. Every output is checked against
the offline ``LLM.generate`` greedy result for the same engine config."""

import asyncio
import time

import pytest

for _dependency in ("fastapi", "uvicorn", "prometheus_client"):  # the server extra
    pytest.importorskip(_dependency)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from helpers.server_helpers import (  # noqa: E402
    PROMPTS,
    chat_prompt_ids,
    leave_after,
    metrics,
    offline_llm,
    serving,
    sse_events,
    stream_text,
    wait_idle,
)
from outpace import SamplingParams  # noqa: E402

GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def server():
    yield from serving("--log-interval", "2", log_says="shutting down")


@pytest.fixture(scope="module")
def llm():
    return offline_llm()


def offline(llm, prompts, **params):
    outs = llm.generate(list(prompts), SamplingParams(**{**GREEDY, **params}))
    return [o.text for o in outs]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tinypy"]
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["kv_blocks_free"] == h["kv_blocks_total"] > 0


def test_openai_completions_stream_equals_offline(client, llm):
    prompt = "def fibonacci(n):"
    expected = offline(llm, [prompt], max_tokens=16)[0]
    resp = client.completions.create(model="tinypy", prompt=prompt, max_tokens=16, temperature=0)
    assert resp.choices[0].text == expected
    assert resp.usage.completion_tokens == 16 and resp.usage.prompt_tokens == len(
        llm.tokenizer.encode(prompt)
    )
    spec = resp.model_extra["spec_metrics"]
    assert spec["num_verifies"] > 0 and spec["acceptance_length"] >= 1
    chunks = list(
        client.completions.create(
            model="tinypy",
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    # Adaptive speculation may verify other draft shapes each time; either way every token but the
    # prefill's came from a verify: accepted drafts plus one bonus token per verify.
    for counted in (spec, finals[0].model_extra["spec_metrics"]):
        assert counted["num_verifies"] + counted["num_accepted_drafts"] == 16 - 1
    usage_chunk = chunks[
        -1
    ]  # the stream's usage chunk carries the same request's metrics as its last choice
    assert usage_chunk.usage.completion_tokens == 16
    assert usage_chunk.model_extra["spec_metrics"] == finals[0].model_extra["spec_metrics"]


def test_openai_chat_stream_equals_offline(client, llm):
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Sort a list."},
    ]
    expected = llm.generate([chat_prompt_ids(llm, messages)], SamplingParams(**GREEDY))[0].text
    resp = client.chat.completions.create(model="tinypy", messages=messages, **GREEDY)
    assert resp.choices[0].message.content == expected
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.prompt_tokens == len(chat_prompt_ids(llm, messages))
    chunks = list(
        client.chat.completions.create(model="tinypy", messages=messages, stream=True, **GREEDY)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["spec_metrics"]["num_verifies"] > 0


def test_n_stop_and_echo(client, llm):
    prompt = PROMPTS[1][:60]
    full = offline(llm, [prompt], max_tokens=16)[0]
    stop = full[6:9]
    assert stop and full.find(stop) == 6
    want = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, stop=[stop]))[0]
    assert want.text == full[:6] and want.finish_reason == "stop"
    resp = client.completions.create(
        model="tinypy", prompt=prompt, max_tokens=16, temperature=0, stop=stop, n=2
    )
    assert [c.text for c in resp.choices] == [want.text] * 2
    assert [c.finish_reason for c in resp.choices] == ["stop"] * 2
    chunks = list(
        client.completions.create(
            model="tinypy", prompt=prompt, max_tokens=16, temperature=0, stop=[stop], stream=True
        )
    )
    assert (
        "".join(c.choices[0].text for c in chunks) == want.text
    )  # the held-back stop prefix never leaks
    echo = client.completions.create(
        model="tinypy", prompt=[prompt, prompt[:30]], max_tokens=4, temperature=0, echo=True
    )
    assert [c.index for c in echo.choices] == [0, 1]
    assert echo.choices[0].text.startswith(prompt) and echo.choices[1].text.startswith(prompt[:30])


def _prompt(i: int) -> str:
    return PROMPTS[i % len(PROMPTS)][: 24 + (i * 13) % 70]


async def _stream(client: httpx.AsyncClient, body: dict) -> tuple[str, str | None]:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, await resp.aread()
        return stream_text(sse_events([line async for line in resp.aiter_lines()]))


def test_200_concurrent_streams_equal_offline(server, llm):
    unique = [_prompt(i) for i in range(50)]
    expected = dict(zip(unique, offline(llm, unique, max_tokens=8)))
    prompts = [unique[i % len(unique)] for i in range(200)]
    before = httpx.get(server.url + "/health").json()

    async def run():
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=300) as c:
            return await asyncio.gather(
                *(_stream(c, {"prompt": p, "temperature": 0, "max_tokens": 8}) for p in prompts)
            )

    results = asyncio.run(run())
    mismatches = [
        (p, text, expected[p]) for p, (text, _) in zip(prompts, results) if text != expected[p]
    ]
    assert not mismatches, mismatches[:3]
    assert all(finish in ("stop", "length") for _, finish in results)
    after = wait_idle(server.url, timeout=10)
    assert after["kv_blocks_free"] == before["kv_blocks_free"] == before["kv_blocks_total"]


def test_disconnected_streams_are_aborted(server, llm):
    keep = [_prompt(i) for i in range(3, 6)]
    expected = offline(llm, keep, max_tokens=12)
    m0 = metrics(server.url)
    aborts0 = m0.get(("outpace:request_success_total", (("finished_reason", "abort"),)), 0)

    async def give_up(
        c: httpx.AsyncClient, prompt: str
    ) -> str:  # a non-streaming client that times out
        # (long before its 1000 tokens could be done, so the server must abort it)
        body = {"prompt": prompt, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
        try:
            await c.post("/v1/completions", json=body, timeout=httpx.Timeout(120, read=0.25))
        except httpx.ReadTimeout:
            return "gave up"
        return "finished"

    async def run():
        limits = httpx.Limits(max_connections=20, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as c:
            return await asyncio.gather(
                *(leave_after(c, _prompt(i)) for i in range(10, 14)),
                give_up(c, _prompt(14)),
                *(_stream(c, {"prompt": p, "temperature": 0, "max_tokens": 12}) for p in keep),
            )

    results = asyncio.run(run())
    assert results[:5] == [3] * 4 + ["gave up"]
    assert [text for text, _ in results[5:]] == expected  # the other streams are unaffected
    wait_idle(server.url, timeout=30)  # every block back: the aborted requests freed theirs
    m1 = metrics(server.url)
    assert m1[("outpace:request_success_total", (("finished_reason", "abort"),))] - aborts0 == 5
    generated = (
        m1[("outpace:generation_tokens_total", ())] - m0[("outpace:generation_tokens_total", ())]
    )
    assert generated < 5 * 1000 / 2  # aborted long before their 1000 tokens


def test_metrics_agree_with_responses(server, client, llm):
    wait_idle(server.url)
    m0 = metrics(server.url)
    responses = [
        client.completions.create(model="tinypy", prompt=_prompt(i), max_tokens=10, temperature=0)
        for i in range(20, 23)
    ]
    responses.append(
        client.chat.completions.create(
            model="tinypy",
            messages=[{"role": "user", "content": "Parse a CSV file."}],
            max_tokens=10,
            temperature=0,
        )
    )
    chunks = list(
        client.completions.create(
            model="tinypy",
            prompt=_prompt(30),
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    specs = [r.model_extra["spec_metrics"] for r in responses] + [
        chunks[-1].model_extra["spec_metrics"]
    ]
    usages = [r.usage for r in responses] + [chunks[-1].usage]
    wait_idle(server.url)
    m1 = metrics(server.url)

    def delta(name, labels=()):
        return m1.get((name, labels), 0) - m0.get((name, labels), 0)

    assert (
        delta("outpace:spec_decode_num_drafts_total") == sum(s["num_verifies"] for s in specs) > 0
    )
    assert delta("outpace:spec_decode_num_draft_tokens_total") == sum(
        s["num_draft_tokens"] for s in specs
    )
    assert delta("outpace:spec_decode_num_accepted_tokens_total") == sum(
        s["num_accepted_drafts"] for s in specs
    )
    for pos in range(5):  # the zoo chain: 5 draft positions
        want = sum(
            s["accepted_per_position"][pos] for s in specs if pos < len(s["accepted_per_position"])
        )
        assert (
            delta(
                "outpace:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(pos)),)
            )
            == want
        )
    assert delta("outpace:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("outpace:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    finished = sum(
        delta("outpace:request_success_total", (("finished_reason", r),))
        for r in ("stop", "length")
    )
    assert finished == 5
    assert delta("outpace:time_to_first_token_seconds_count") == 5
    assert delta("outpace:e2e_request_latency_seconds_count") == 5
    assert delta("outpace:request_queue_time_seconds_count") == 5
    assert delta("outpace:inter_token_latency_seconds_count") == sum(
        u.completion_tokens - 1 for u in usages
    )
    assert m1[("outpace:kv_blocks_free", ())] == m1[("outpace:kv_blocks_total", ())]
    assert m1[("outpace:num_requests_running", ())] == 0


def test_bench_serve(server, capsys, tmp_path):
    from outpace.server.bench import run_serve_bench

    s = run_serve_bench(
        server.url, num_requests=6, concurrency=3, max_tokens=8, out_json=str(tmp_path / "b.json")
    )
    assert s["num_failed"] == 0 and s["output_tokens"] > 0 and s["tau"] > 1
    assert s["ttft_s"]["p50"] > 0 and s["e2e_s"]["p99"] >= s["e2e_s"]["p50"]
    out = capsys.readouterr().out
    assert "TTFT ms" in out and "tau" in out and (tmp_path / "b.json").is_file()


def test_periodic_log_line(server):
    deadline = time.monotonic() + 10
    while "tau" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    line = next(line for line in server.output().splitlines() if "generation throughput" in line)
    assert "tokens/s" in line and "tau" in line
