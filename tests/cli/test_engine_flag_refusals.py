"""Engine flags that would be silently unused or never act are refused by name, before the model loads:
--cuda-graph-sizes on the CPU or with --enforce-eager (EngineConfig.cuda_graph_sizes with cuda_graphs False),
as --gpu-memory-utilization on the CPU is; serve's --log-interval inf or nan (which never logged), 0 or
negative; serve's --max-num-seqs past what memory holds (tests/engine/test_max_num_seqs_memory.py)."""

from __future__ import annotations

import socket

import pytest

import outpace.server.app
from outpace.cli import main, parse_args
from outpace.cli.engine_args import engine_kwargs
from outpace.config import EngineConfig
from outpace.engine import memory
from outpace.engine.engine import LLMEngine
from outpace.validation import ConfigError

ZOO = "zoo/tinypy"
PROMPT = ["--prompt-token-ids", "1", "--max-tokens", "1"]


@pytest.mark.parametrize("device", ["cpu", "auto"])  # ('auto' is the CPU in the tests: conftest.py)
def test_cuda_graph_sizes_on_the_cpu_are_refused_naming_both_flags(device):
    with pytest.raises(SystemExit) as e:
        main(["generate", ZOO, "--device", device, "--cuda-graph-sizes", "1", "2", *PROMPT])
    assert str(e.value.code).startswith(
        f"error: --cuda-graph-sizes 1 2 does not apply with --device {device}"
    ), e.value.code
    assert "CUDA graphs are captured on a GPU only" in str(e.value.code)


def test_cuda_graph_sizes_with_enforce_eager_are_refused_naming_both_fields():
    flags = ["--device", "cuda", "--enforce-eager", "--cuda-graph-sizes", "4"]
    # (the engine's keyword arguments of a GPU's command line, its device made the CPU: the machine may have none)
    kwargs = {**engine_kwargs(parse_args(["generate", ZOO, *flags, *PROMPT])), "device": "cpu"}
    with pytest.raises(ConfigError) as refused:
        EngineConfig(model=ZOO, **kwargs)
    assert str(refused.value) == (
        "EngineConfig.cuda_graph_sizes=(4,) does not apply with EngineConfig.cuda_graphs=False "
        "(--enforce-eager): no step is captured; leave cuda_graph_sizes out or turn CUDA graphs on"
    )
    assert EngineConfig(model=ZOO, device="cpu", cuda_graphs=False).cuda_graph_sizes is None


@pytest.mark.parametrize("sizes", [(0,), (-1,), (True,), (2.0,), (), "4", [1, "2"]])
def test_cuda_graph_sizes_must_be_positive_batch_sizes(sizes):
    with pytest.raises(ConfigError, match=r"EngineConfig.cuda_graph_sizes=.* is invalid"):
        EngineConfig(model=ZOO, device="cpu", cuda_graph_sizes=sizes)


def test_a_cuda_graph_size_below_one_is_the_flags_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["generate", ZOO, "--cuda-graph-sizes", "4", "0", *PROMPT])
    assert e.value.code == 2
    assert "argument --cuda-graph-sizes: 0 is invalid: must be an integer >= 1" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1"])
def test_a_log_interval_that_never_logs_is_refused(value, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", ZOO, f"--log-interval={value}"])
    assert e.value.code == 2
    assert (
        f"argument --log-interval: {value} is invalid: must be a finite number of seconds > 0"
        in capsys.readouterr().err
    )


def test_a_positive_log_interval_is_taken():
    assert parse_args(["serve", ZOO, "--log-interval", "0.5"]).log_interval == 0.5
    assert parse_args(["serve", ZOO]).log_interval == 10.0


def test_serve_refuses_max_num_seqs_past_memory_by_name(monkeypatch):
    """The serve command's --max-num-seqs reaches the engine's refusal, printed as one error line."""
    monkeypatch.setattr(memory, "_available_ram", lambda: 64 << 20)
    monkeypatch.setattr(
        outpace.server.app,
        "run_server",
        lambda config, **kw: LLMEngine(config, progress=False),
    )
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    with pytest.raises(SystemExit) as e:
        main(["serve", ZOO, "--device", "cpu", "--port", port, "--max-num-seqs", "100000"])
    assert str(e.value.code).startswith(
        "error: EngineConfig.max_num_seqs=100000 is invalid: the engine allocates a block-table row"
    ), e.value.code
