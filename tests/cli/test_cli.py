"""What a new user types first: the CLI's model, device, version and prompt forms."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from outpace.cli import main, parse_args
from outpace.cli.engine_args import engine_kwargs
from outpace.config import EngineConfig
from outpace.validation import ConfigError
from outpace.zoo import default_model

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"outpace {__import__('outpace').__version__}"


def test_positional_model_equals_the_flag(llama_dir):
    a = parse_args(["generate", str(llama_dir), "--prompt", "x"])
    b = parse_args(["generate", "--model", str(llama_dir), "--prompt", "x"])
    assert a.model == b.model == str(llama_dir)
    with pytest.raises(SystemExit, match="two models given"):
        main(["generate", str(llama_dir), "--model", str(default_model()), "--prompt", "x"])
    assert parse_args(["serve", str(llama_dir)]).model == str(llama_dir)
    assert parse_args(["serve"]).model == str(default_model())  # none given: the zoo target


def test_device_defaults_to_the_gpu_when_present(llama_dir):
    """In a process of its own: conftest makes 'auto' the CPU in this one."""
    code = (
        f"import torch; from outpace.config import EngineConfig; "
        f"print(EngineConfig(model={str(llama_dir)!r}).device, torch.cuda.is_available())"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    device, cuda = run.stdout.split()
    assert device == ("cuda" if cuda == "True" else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line(llama_dir, capsys):
    with pytest.raises(ConfigError, match=r"device='cuda' is invalid: torch .* sees no GPU here"):
        EngineConfig(model=str(llama_dir), device="cuda")
    with pytest.raises(SystemExit) as e:
        main(["generate", str(llama_dir), "--device", "cuda", "--prompt-token-ids", "1"])
    assert (
        str(e.value.code).startswith("error: EngineConfig.device='cuda' is invalid")
        and "\n" not in e.value.code
    )


def test_memory_utilization_flags_that_cannot_apply_are_refused(llama_dir):
    """--gpu-memory-utilization defaults to unset (0.9 on a GPU), so that one given is never
    silently unused: on the CPU, or beside --num-kv-blocks."""
    a = parse_args(["generate", str(llama_dir), "--prompt", "x"])
    assert engine_kwargs(a)["gpu_memory_utilization"] is None
    prompt = ["--prompt-token-ids", "1", "--max-tokens", "1"]
    refusals = {
        "EngineConfig.gpu_memory_utilization=0.5 does not apply on device='cpu'": [
            "--gpu-memory-utilization",
            "0.5",
        ],
        "EngineConfig.num_kv_blocks=8 and EngineConfig.cpu_memory_utilization=0.5 both size": [
            "--num-kv-blocks",
            "8",
            "--cpu-memory-utilization",
            "0.5",
        ],
    }
    for message, flags in refusals.items():
        with pytest.raises(SystemExit) as e:
            main(["generate", str(llama_dir), "--device", "cpu", *flags, *prompt])
        assert str(e.value.code).startswith(f"error: {message}")


def test_token_id_prompt_for_a_model_without_tokenizer(llama_dir, capsys):
    main(
        [
            "generate",
            str(llama_dir),
            "--device",
            "cpu",
            "--prompt-token-ids",
            "5",
            "6",
            "7",
            "--max-tokens",
            "4",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 4 and out["text"] == ""
    main(
        [
            "generate",
            str(llama_dir),
            "--device",
            "cpu",
            "--prompt-token-ids",
            "5",
            "6",
            "7",
            "--max-tokens",
            "4",
        ]
    )
    assert capsys.readouterr().out.split() == [str(t) for t in out["token_ids"]]
    with pytest.raises(SystemExit, match="has no tokenizer: pass the prompt as token ids"):
        main(["generate", str(llama_dir), "--device", "cpu", "--prompt", "text"])


def test_main_command_without_triton(tmp_path):
    """The README's main command where `import triton` fails (as on a CPU-only torch install)."""
    blocker = tmp_path / "triton"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('triton is not installed here')\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "outpace",
            "generate",
            "--device",
            "cpu",
            "--max-tokens",
            "8",
            "--prompt",
            "def fibonacci(n):",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("def fibonacci(n):") and "tau" in run.stderr


@pytest.mark.slow
def test_non_editable_install_finds_the_zoo(tmp_path):
    """`pip install .` (not editable) carries the zoo as package data, and the default model resolves to it."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    code = "from outpace.zoo import default_model; print(default_model())"
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(run.stdout.strip()) == target / "outpace" / "zoo" / "tinypy"
    assert (target / "outpace" / "zoo" / "tinypy-eagle3" / "model.safetensors").is_file()


def test_a_request_that_fails_ends_the_command_with_its_error(llama_dir, monkeypatch):
    """It printed an empty output and exited 0 (found by fuzzing the loader)."""
    from outpace.engine.runner import ModelRunner

    def fail(self, batch, closed=False):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(ModelRunner, "execute", fail)
    argv = ["generate", str(llama_dir), "--device", "cpu", "--prompt-token-ids", "5", "6"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert str(e.value.code).startswith("error: the request failed: RuntimeError: injected failure")
