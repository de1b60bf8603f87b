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


def test_state_checkpoints_with_prefix_caching_off_are_refused_naming_both():
    """--num-state-checkpoints N with --no-enable-prefix-caching allocated nothing and was silently dropped (the
    checkpoints serve prefix caching alone); 0 agrees with it and is taken."""
    flags = ["--device", "cpu", "--no-enable-prefix-caching", "--num-state-checkpoints"]
    kwargs = engine_kwargs(parse_args(["generate", ZOO, *flags, "4", *PROMPT]))
    with pytest.raises(ConfigError) as refused:
        EngineConfig(model=ZOO, **kwargs)
    assert str(refused.value).startswith(
        "EngineConfig.num_state_checkpoints=4 does not apply with "
        "EngineConfig.enable_prefix_caching=False (--no-enable-prefix-caching)"
    )
    kwargs = engine_kwargs(parse_args(["generate", ZOO, *flags, "0", *PROMPT]))
    assert EngineConfig(model=ZOO, **kwargs).num_state_checkpoints == 0


@pytest.mark.parametrize("command", [["generate", *PROMPT], ["serve", "--dp", "2"]])
def test_enable_expert_parallel_without_tensor_parallel_ranks_is_refused(command):
    """vLLM's --enable-expert-parallel with --tensor-parallel-size 1 (alone, or beside serve's data-parallel
    replicas, over which vLLM spreads the experts) made EP = TP = 1: the flag was silently dropped."""
    a = parse_args([command[0], ZOO, "--device", "cpu", "--enable-expert-parallel", *command[1:]])
    with pytest.raises(ValueError, match="^--enable-expert-parallel places the experts over the "):
        engine_kwargs(a)
    a = parse_args([command[0], ZOO, "--enable-expert-parallel", "--tp", "2", *command[1:]])
    assert engine_kwargs(a, speculative=False)["expert_parallel_size"] == 2


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["serve", ZOO, "--max-tokens", "5"], "--max-tokens"),  # (was --max-tokens-limit)
        (["generate", ZOO, *PROMPT, "--speculative", "map.pt"], "--speculative"),
        (["generate", ZOO, *PROMPT, "--temp", "0.5"], "--temp"),  # (was --temperature)
        (["bench", "speed", "--model", ZOO, "--batch", "4"], "--batch"),  # (was --batch-sizes)
        (["train", "draft", "--method", "mtp", "--out", "x", "--nproc", "2"], "--nproc"),
    ],
)
def test_a_flag_we_do_not_take_is_refused_not_read_as_one_it_begins(argv, flag, capsys):
    """argparse's prefix matching read a flag that only begins one of ours (serve's --max-tokens, which vLLM's
    sampling habits bring) as that flag, silently."""
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
