"""How the CLI leaves in a process that torchrun started (distributed/process_exit.py): the command done and its
engine closed, it flushes and calls ``os._exit`` with the interpreter's exit code, skipping the teardown that
aborted a two-node driver on gloo at exit (tests/distributed/test_expert_parallel_nodes.py, under CI's load).
``os._exit`` is replaced by one that records its code and stops the command line, so the test process lives."""

from __future__ import annotations

import os
import sys

import pytest

from outpace import LLM
from outpace.cli import main
from outpace.distributed.process_exit import run_then_leave

GENERATE = ["--prompt-token-ids", "1", "5", "2", "--max-tokens", "4", "--ignore-eos"]


class Left(BaseException):
    """What the stand-in ``os._exit`` raises: the process would have ended here."""


@pytest.fixture
def events(monkeypatch) -> list:
    """What happened, in order: ("exit", code) for each ``os._exit``."""
    events: list = []

    def exit_(code: int) -> None:
        events.append(("exit", code))
        raise Left

    monkeypatch.setattr(os, "_exit", exit_)
    return events


@pytest.fixture
def torchrun(monkeypatch):
    """The environment torchrun gives its one rank (RANK, WORLD_SIZE: distributed/process_exit.py
    ``launched_by_torchrun``)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


def test_a_torchrun_driver_leaves_with_0_after_its_output_and_the_engine_closed(
    llama_dir, events, torchrun, monkeypatch, capsys
):
    close = LLM.close

    def recorded_close(llm: LLM) -> None:
        events.append("close")
        close(llm)

    monkeypatch.setattr(LLM, "close", recorded_close)
    with pytest.raises(Left):
        main(["generate", str(llama_dir), "--device", "cpu", *GENERATE])
    assert events == ["close", ("exit", 0)]
    assert len(capsys.readouterr().out.split()) == 4


def test_a_plain_run_returns_through_the_interpreter(llama_dir, events, monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    main(["generate", str(llama_dir), "--device", "cpu", *GENERATE])
    assert events == []
    assert len(capsys.readouterr().out.split()) == 4


def test_a_torchrun_command_that_fails_leaves_with_its_error(
    tmp_path, events, torchrun, monkeypatch, capsys
):
    """The CLI's one-line error and exit code 1, as without torchrun (``sys.exit`` of the message)."""
    monkeypatch.setattr("outpace.cli.generate.check_model_dir", lambda model: None)
    # a model the engine refuses: its config names no architecture
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(Left):
        main(["generate", str(tmp_path), "--device", "cpu", *GENERATE])
    assert events == [("exit", 1)]
    assert capsys.readouterr().err.startswith("error: ")


def raise_(error: BaseException):
    def command() -> None:
        raise error

    return command


@pytest.mark.parametrize(
    "command, code, stderr",
    [
        (lambda: None, 0, ""),
        (raise_(SystemExit(None)), 0, ""),
        (raise_(SystemExit(3)), 3, ""),
        (raise_(SystemExit("error: no model")), 1, "error: no model\n"),
        (raise_(RuntimeError("a bug")), 1, "RuntimeError: a bug\n"),
        (raise_(KeyboardInterrupt()), 130, "KeyboardInterrupt\n"),
    ],
)
def test_the_exit_code_and_report_are_the_interpreters(
    command, code, stderr, events, capsys, monkeypatch
):
    # the interpreter's own report: torch.distributed, once a test of this process used it, wraps
    # sys.excepthook to prefix every line with the rank ("[rank0]: ")
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    with pytest.raises(Left):
        run_then_leave(command)
    assert events == [("exit", code)]
    err = capsys.readouterr().err
    assert err.endswith(stderr)
    # a traceback, then the exception's line
    if stderr.startswith(("RuntimeError", "KeyboardInterrupt")):
        assert err.startswith("Traceback (most recent call last):")
