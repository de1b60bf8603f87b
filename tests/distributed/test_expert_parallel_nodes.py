"""Two "machines" on this one: two torchrun launches (``--nnodes 2 --nproc-per-node 1``, one per node rank) that
meet at a shared rendezvous on 127.0.0.1 run one engine over their two ranks (CPU, gloo, fp32), through the
CLI exactly as on two hosts (README: several machines). The first node prints the tokens; they equal one
process's. Launched with different flags, both nodes stop at start-up with an error naming the differing field
(distributed/agreement.py), before any model is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def two_nodes(
    model: str, flags: list[list[str]], timeout_s: float = 240
) -> list[subprocess.CompletedProcess]:
    """``outpace generate`` under one torchrun per node (node rank i with ``flags[i]``), both at one rendezvous."""
    port = str(free_port())
    launches = [
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
                "generate",
                model,
                *GENERATE,
                *flags[node],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            cwd=REPO,
        )  # fmt: skip
        for node in range(2)
    ]
    done = []
    try:
        for p in launches:
            out, err = p.communicate(timeout=timeout_s)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in launches:  # our own launches, by handle
            if p.poll() is None:
                p.kill()
    return done


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
