"""What a first command costs and prints: `--help` loads no torch, a refused prompt logs only the refusal
(issue 42 item 9)."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from outpace import LLM

ROOT = Path(__file__).resolve().parents[2]


def test_help_imports_neither_torch_nor_transformers():
    """`python -m outpace --help` took 6.6 s, almost all of it importing torch for nothing."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "outpace", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage: outpace" in run.stdout
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if "|" in line}
    assert not {"torch", "transformers"} & imported


@pytest.fixture
def transformers_warnings():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers")  # its own root: records do not reach pytest's
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_a_refused_long_prompt_logs_no_tokenizer_warning(zoo_like_dir, transformers_warnings):
    """The tokenizer's model_max_length (512 here) is not the engine's limit: the engine refuses a
    prompt past its context itself, and transformers' "indexing errors" warning only confused."""
    llm = LLM(str(zoo_like_dir), device="cpu")
    with pytest.raises(ValueError, match="the context holds"):
        llm.generate(["word " * 2000])
    assert [r.getMessage() for r in transformers_warnings] == []
