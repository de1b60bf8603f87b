"""``outpace bench serve --sweep`` end to end on the CPU (real servers of the zoo target, plain and with
its EAGLE3 draft), and the request mix it sends."""

import json

import pytest

for _dependency in ("fastapi", "uvicorn", "prometheus_client", "httpx", "matplotlib"):
    pytest.importorskip(_dependency)

from helpers.server_helpers import PROMPTS, ROOT  # noqa: E402
from outpace.bench.local_server import LocalServer  # noqa: E402
from outpace.bench.request_mix import request_mix, shared_prefixes  # noqa: E402
from outpace.cli import main  # noqa: E402

BLOCK_SIZE = 16  # the engine's default


def test_request_mix_is_seeded_and_shares_its_prefixes():
    from tokenizers import Tokenizer

    prefixes = shared_prefixes(PROMPTS)
    assert (
        len({p[:40] for p in prefixes}) == len(prefixes) == 4
    )  # four prefixes, different from the start
    tokens = [
        len(Tokenizer.from_file(str(ROOT / "zoo/tinypy/tokenizer.json")).encode(p).ids)
        for p in prefixes
    ]
    assert (
        tokens == sorted(tokens) and tokens[-1] > 8 * BLOCK_SIZE
    )  # varied; the longest over several blocks
    mix = request_mix(PROMPTS, 64, seed="0:8", max_tokens=(32, 128))
    assert mix == request_mix(PROMPTS, 64, seed="0:8", max_tokens=(32, 128))
    other = request_mix(PROMPTS, 64, seed="0:16", max_tokens=(32, 128))
    assert other != mix
    for requests in (
        mix,
        other,
    ):  # every request starts with one of the same prefixes, whatever the seed
        used = [next(i for i, p in enumerate(prefixes) if r.prompt.startswith(p)) for r in requests]
        assert set(used) == set(range(4))
        users = [r.prompt[len(prefixes[i]) :] for r, i in zip(requests, used)]
        assert all(users) and len({len(u) for u in users}) > 32  # user parts of varied lengths
        assert (
            all(32 <= r.max_tokens <= 128 for r in requests)
            and len({r.max_tokens for r in requests}) > 24
        )


def test_a_server_that_dies_shows_its_log():
    with (
        LocalServer(str(ROOT / "outpace")) as server,
        pytest.raises(RuntimeError, match="not a model directory"),
    ):
        server.wait_ready(60)


def test_a_server_whose_port_was_taken_starts_on_another(monkeypatch):
    """The port a server was given is taken before it binds it (a test beside it: CI's busy machine once failed
    the sweep so): it starts again on a port free then, and the first one's log does not end it."""
    import socket

    import outpace.bench.local_server as local_server

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy, local_server.free_port()])
        monkeypatch.setattr(local_server, "free_port", lambda: next(ports))
        with LocalServer("--method", "none") as server:
            server.wait_ready(120)
            assert server.port != busy and server.port_tries == 2


def test_one_concurrency_without_sweep():
    with pytest.raises(SystemExit, match="--sweep"):
        main(["bench", "serve", "--concurrency", "1", "2"])


def test_sweep_on_the_cpu(tmp_path, capsys):
    main(
        [
            "bench",
            "serve",
            "--sweep",
            "--model-dir",
            str(ROOT / "zoo"),
            "--device",
            "cpu",
            "--concurrency",
            "1",
            "4",
            "--min-requests",
            "4",
            "--requests-per-concurrency",
            "1",
            "--min-tokens",
            "16",
            "--max-tokens",
            "32",
            "--warmup-requests",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    result = json.loads((tmp_path / "serve_sweep.json").read_text())
    rows = {(r["method"], r["concurrency"]): r for r in result["rows"]}
    assert list(rows) == [("none", 1), ("none", 4), ("eagle3", 1), ("eagle3", 4)]
    for (method, c), r in rows.items():
        sent = request_mix(PROMPTS, 4, seed=f"0:{c}", max_tokens=(16, 32))
        assert r["num_requests"] == 4 and r["num_failed"] == 0, r["errors"]
        assert r["output_tokens"] == sum(
            q.max_tokens for q in sent
        )  # ignore_eos: each generates its max_tokens
        assert r["prefix_cache_hit_rate"] > 0  # the shared prefixes
        assert (
            0 < r["ttft_s"]["p50"] <= r["ttft_s"]["p99"]
            and 0 < r["itl_s"]["p50"] <= r["itl_s"]["p99"]
        )
        assert 0 < r["e2e_s"]["p50"] <= r["e2e_s"]["p99"] and r["output_tokens_per_s"] > 0
        if method == "none":
            assert r["tau"] is None and r["spec_verifies"] == 0 and r["speedup"] == 1.0
        else:
            assert r["tau"] > 1 and r["speedup"] > 0
    assert (
        "--draft" in result["servers"]["eagle3"]
        and result["device"]
        and result["versions"]["torch"]
    )
    for name in ("serve_sweep.png", "serve_none.log", "serve_eagle3.log"):
        assert (tmp_path / name).stat().st_size > 0
    assert "vs none" in capsys.readouterr().out
