"""``outpace generate`` (and ``serve``, the same engine flags) with vLLM's ``--generation-config`` and
``--override-generation-config``: the sampling flags not given come from the model's generation_config.json, then
from this command's own defaults (outpace/generation_defaults.py)."""

from __future__ import annotations

import json

import pytest

from helpers.generation_config_dirs import tinypy_with_generation_config
from outpace.cli import main, parse_args

GENERATE = ["--device", "cpu", "--num-kv-blocks", "64", "--prompt-token-ids", "5", "6", "7"]


def generated_tokens(capsys, model: str, *flags: str) -> int:
    main(["generate", model, *GENERATE, "--ignore-eos", "--json", *flags])
    return len(json.loads(capsys.readouterr().out)["token_ids"])


def test_generate_takes_the_files_defaults_under_its_flags(tmp_path, capsys):
    model = tinypy_with_generation_config(tmp_path / "tinypy", {"max_new_tokens": 3})
    assert generated_tokens(capsys, model) == 3
    assert generated_tokens(capsys, model, "--max-tokens", "5") == 5
    override = ["--override-generation-config", '{"max_new_tokens": 2}']
    assert generated_tokens(capsys, model, *override) == 2
    assert generated_tokens(capsys, model, "--generation-config", "vllm", *override) == 2
    assert generated_tokens(capsys, model, "--generation-config", "vllm") == 64  # generate's own
    other = tinypy_with_generation_config(tmp_path / "other", {"max_new_tokens": 4})
    assert generated_tokens(capsys, model, "--generation-config", other) == 4
    with pytest.raises(
        SystemExit, match="--generation-config .*: there is no .*generation_config.json"
    ):
        main(["generate", model, *GENERATE, "--generation-config", str(tmp_path / "nowhere")])
    for text in ("{temperature: 0}", "[1]"):
        with pytest.raises(SystemExit) as e:
            parse_args(["serve", "--override-generation-config", text])
        assert e.value.code == 2
        assert "argument --override-generation-config" in capsys.readouterr().err
