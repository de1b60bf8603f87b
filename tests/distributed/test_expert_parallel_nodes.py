"""Two "machines" on this one: two torchrun launches (``--nnodes 2 --nproc-per-node 1``, one per node rank) that
meet at a shared rendezvous on 127.0.0.1 run one engine over their two ranks (CPU, gloo, fp32), through the
CLI exactly as on two hosts (README: several machines). The first node prints the tokens; they equal one
process's. Launched with different flags, both nodes stop at start-up with an error naming the differing field
(distributed/agreement.py), before any model is built. ``outpace serve`` alike: rank 0 serves HTTP, rank 1 follows
its steps, a completion equals one process's greedy ids and SIGTERM to the server stops both nodes with exit 0;
a node's rank killed (SIGKILL) makes the other exit non-zero within seconds naming the lost rank
(distributed/launch.py ``lost_ranks``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.deepseek_models import make_hf_deepseek
from helpers.hf_models import save_hf_model
from outpace.distributed.launch import free_port

REPO = Path(__file__).resolve().parents[2]
PROMPT = ["1", "5", "2", "7", "3", "9", "4"]
GENERATE = [
    "--device", "cpu", "--dtype", "float32", "--prompt-token-ids", *PROMPT, "--max-tokens", "10",
    "--ignore-eos", "--num-kv-blocks", "32", "--block-size", "4",
]  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    shape = dict(
        num_attention_heads=6, num_key_value_heads=6, intermediate_size=96, n_routed_experts=12
    )
    return str(save_hf_model(make_hf_deepseek("v3-yarn", **shape), tmp_path_factory.mktemp("v3")))


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def launch_nodes(args: list[list[str]], logs: Path | None = None) -> list[subprocess.Popen]:
    """One torchrun per node (node rank i running ``python -m outpace *args[i]``), both at one rendezvous on
    127.0.0.1; their output piped, or written to ``logs``/node{i}.out and .err."""
    port = str(free_port())
    launches = []
    for node in range(2):
        out = err = subprocess.PIPE
        if logs is not None:
            out, err = (open(logs / f"node{node}.{kind}", "w") for kind in ("out", "err"))
        launches.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--node-rank",
                    str(node),
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    port,
                    "-m",
                    "outpace",
                    *args[node],
                ],
                stdout=out,
                stderr=err,
                text=True,
                env=env(),
                cwd=REPO,
            )  # fmt: skip
        )
    return launches


def finish(launches: list[subprocess.Popen], timeout_s: float) -> list[subprocess.CompletedProcess]:
    """Wait for every launch (killing, by handle, any still running after ``timeout_s`` in all)."""
    deadline, done = time.monotonic() + timeout_s, []
    try:
        for p in launches:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in launches:  # our own launches, by handle
            if p.poll() is None:
                p.kill()
    return done


def two_nodes(
    model: str, flags: list[list[str]], timeout_s: float = 240
) -> list[subprocess.CompletedProcess]:
    """``outpace generate`` under one torchrun per node (node rank i with ``flags[i]``), both at one rendezvous."""
    return finish(
        launch_nodes([["generate", model, *GENERATE, *flags[node]] for node in range(2)]),
        timeout_s,
    )


def one_process(model: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "outpace", "generate", model, *GENERATE],
        capture_output=True, text=True, env=env(), cwd=REPO, timeout=240, check=True,
    )  # fmt: skip
    return run.stdout


def test_two_nodes_give_one_process_tokens(model):
    """EP = TP = 2 over the two nodes (vLLM's --enable-expert-parallel): attention heads split, experts whole."""
    flags = ["--tensor-parallel-size", "2", "--enable-expert-parallel"]
    first, second = two_nodes(model, [flags, flags])
    assert first.returncode == 0 and second.returncode == 0, (
        first.stderr[-2000:] + second.stderr[-2000:]
    )
    assert len(first.stdout.split()) == 10
    assert first.stdout == one_process(model)
    assert second.stdout == ""  # (the other node serves the first)


def test_nodes_started_with_different_flags_stop_naming_the_field(model):
    flags = ["--expert-parallel-size", "2"]
    nodes = two_nodes(model, [flags, [*flags, "--max-num-batched-tokens", "64"]])
    for node in nodes:
        assert node.returncode != 0
        assert "rank 1 EngineConfig.max_num_batched_tokens=64 (rank 0: 2048)" in node.stderr


EP_TP_2 = ["--tensor-parallel-size", "2", "--enable-expert-parallel"]


def serve_on_two_nodes(model: str, logs: Path) -> tuple[list[subprocess.Popen], str]:
    """``outpace serve`` under two torchrun nodes (EP = TP = 2); returns the launches and rank 0's URL once
    it answers /health (rank 1 follows it)."""
    port = free_port()
    serve = [
        "serve", model, "--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "32",
        "--block-size", "4", "--port", str(port), "--log-level", "warning", *EP_TP_2,
        "--dist-timeout", "60",
    ]  # fmt: skip
    launches = launch_nodes([serve, serve], logs)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        exited = [p.returncode for p in launches if p.poll() is not None]
        assert not exited, (
            f"a node exited with {exited}: {(logs / 'node0.err').read_text()[-3000:]}"
        )
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if json.load(r)["status"] == "ok":
                    return launches, url
        except OSError:
            pass
        time.sleep(0.5)
    for p in launches:
        p.kill()
    raise AssertionError(f"the server did not come up: {(logs / 'node0.err').read_text()[-3000:]}")


def complete(url: str) -> dict:
    """Greedy ids for PROMPT over HTTP (the model has no tokenizer: logprobs name each token's id)."""
    body = {
        "prompt": [int(t) for t in PROMPT],
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
    }
    body["logprobs"] = 0
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


def worker_pid(launch: subprocess.Popen) -> int:
    """The process torchrun started for its one rank (its child, found by parent id in /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == launch.pid:
            return int(stat.parent.name)
    raise AssertionError(f"torchrun {launch.pid} has no worker process")


def test_a_server_over_two_nodes_answers_as_one_process_and_stops_every_rank(model, tmp_path):
    """Rank 0 serves HTTP, rank 1 follows its steps; SIGTERM to the server stops both ranks cleanly (exit 0)."""
    launches, url = serve_on_two_nodes(model, tmp_path)
    try:
        choice = complete(url)["choices"][0]
        tokens = [t.removeprefix("token_id:") for t in choice["logprobs"]["tokens"]]
        assert " ".join(tokens) + "\n" == one_process(model)
        assert choice["finish_reason"] == "length"
        os.kill(worker_pid(launches[0]), signal.SIGTERM)  # what a process manager sends the server
        done = finish(launches, timeout_s=60)
    finally:
        for p in launches:
            if p.poll() is None:
                p.kill()
    errors = [(tmp_path / f"node{i}.err").read_text()[-2000:] for i in range(2)]
    assert [d.returncode for d in done] == [0, 0], errors


@pytest.mark.parametrize("lost", [1, 0])
def test_a_lost_rank_stops_the_other_naming_it(lost, model, tmp_path):
    """SIGKILL one node's rank while the server is up (rank 1: a request's step finds it gone; rank 0: the
    follower's wait for the next step fails at once): the other node exits non-zero within a bounded time,
    naming the lost rank; the server answers the request an error instead of hanging. (Rank 0's step
    broadcast usually fails at once too; where gloo misses the lost connection, it gives up after
    --dist-timeout, 60 s here, inside the request's 120 s.)"""
    launches, url = serve_on_two_nodes(model, tmp_path)
    try:
        os.kill(worker_pid(launches[lost]), signal.SIGKILL)
        if lost == 1:
            with pytest.raises(urllib.error.HTTPError) as answer:
                complete(url)
            assert answer.value.code == 500
        start = time.monotonic()
        survivor = launches[1 - lost]
        survivor.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        for p in launches:
            if p.poll() is None:
                p.kill()
    err = (tmp_path / f"node{1 - lost}.err").read_text()
    assert survivor.returncode != 0
    assert f"rank {lost}" in err and "lost" in err, err[-3000:]
    assert took < 30, f"the surviving node took {took:.1f} s to stop"
