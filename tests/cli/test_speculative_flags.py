"""--method, --draft and --num-steps: defaults come from the drafter's class, and a draft flag that cannot
work is refused, naming the flag, before the target loads (issue 42 item 9)."""

import json
from pathlib import Path

import pytest

import outpace
from outpace.cli import main
from outpace.config import SpeculativeConfig
from outpace.registry import proposer_class
from outpace.zoo import default_draft, zoo_dir

ZOO = zoo_dir()


class TargetLoaded(AssertionError):
    pass


@pytest.fixture
def no_target_load(monkeypatch):
    """Any attempt to build the engine (and so load the target) fails the test."""

    def refuse(*args, **kwargs):
        raise TargetLoaded("the target was loaded before the flags were checked")

    monkeypatch.setattr(outpace, "LLM", refuse, raising=False)


def generate(*flags: str) -> None:
    main(["generate", "--device", "cpu", "--prompt", "def f(x):", *flags])


def test_mtp_on_a_qwen35_target_runs_with_default_flags(capsys):
    """zoo/tinyqwen35 declares its 2 MTP layers as mtp_num_hidden_layers; the default was 5 steps."""
    target = str(ZOO / "tinyqwen35")
    generate(target, "--method", "mtp", "--max-tokens", "6", "--json")
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 6
    assert out["speculative"]["num_verifies"] > 0


def test_drafters_declare_their_default_steps():
    """num_steps None (the CLI without --num-steps, or the API) is the drafter's default for its draft."""
    dflash = json.loads((ZOO / "tinypy-dflash" / "config.json").read_text())
    assert (
        proposer_class("dflash").default_num_steps(ZOO / "tinypy-dflash")
        == dflash["block_size"] - 1
    )
    assert proposer_class("eagle3").default_num_steps(ZOO / "tinypy-eagle3") == 5
    spec = SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"))
    assert (spec.num_steps, spec.num_draft_tokens) == (
        dflash["block_size"] - 1,
        dflash["block_size"],
    )
    assert spec.adaptive
    assert SpeculativeConfig("mtp").num_steps == 5
    assert SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=3).num_steps == 3


def test_a_zoo_model_finds_its_zoo_draft():
    assert default_draft("eagle3") == (ZOO / "tinypy-eagle3").resolve()
    assert default_draft("eagle3", ZOO / "tinyqwen35") == (ZOO / "tinyqwen35-eagle3").resolve()
    assert default_draft("dflash", ZOO / "tinyqwen35") is None
    assert default_draft("eagle3", Path("/elsewhere/tinypy")) is None


def test_a_missing_draft_directory_is_refused_before_the_target_loads(no_target_load, tmp_path):
    missing = tmp_path / "no-such-draft"
    with pytest.raises(SystemExit) as e:
        generate("--method", "eagle3", "--draft", str(missing))
    assert e.value.code == f"error: --draft {missing}: no such directory"


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_a_target_given_as_draft_names_the_flag_and_directory(no_target_load, method):
    target = ZOO / "tinypy"
    with pytest.raises(SystemExit) as e:
        generate("--method", method, "--draft", str(target))
    message = str(e.value.code)
    assert message.startswith(
        f"error: --draft {target} is not a draft checkpoint for --method {method}"
    )
    assert "a target checkpoint?" in message


@pytest.mark.parametrize("method", ["none", "ngram", "mtp"])
def test_a_draft_for_a_drafter_that_loads_none_is_refused(no_target_load, method):
    with pytest.raises(SystemExit) as e:
        generate("--method", method, "--draft", str(ZOO / "tinypy-eagle3"))
    assert str(e.value.code).startswith(
        f"error: --draft {ZOO / 'tinypy-eagle3'} is given, but --method"
    )


def test_a_draft_without_a_method_is_refused_off_the_zoo_target(no_target_load, llama_dir):
    """On a model that is not the zoo target the method defaults to none: --draft alone drafts nothing."""
    with pytest.raises(SystemExit, match="--method is none: name the drafter with --method"):
        generate(str(llama_dir), "--draft", str(ZOO / "tinypy-eagle3"))


def test_a_drafter_that_needs_a_draft_asks_for_the_flag(no_target_load, llama_dir):
    with pytest.raises(SystemExit, match="--method dflash needs --draft DIR"):
        generate(str(llama_dir), "--method", "dflash")


@pytest.mark.parametrize(
    "flags", [("--num-steps", "3"), ("--topk", "2"), ("--num-draft-tokens", "4")]
)
def test_a_draft_shape_without_a_drafter_is_refused_by_name(no_target_load, llama_dir, flags):
    """--num-steps, --topk and --num-draft-tokens with --method none (given, or the default off the zoo target)
    drafted nothing and were silently dropped."""
    for method in (["--method", "none"], []):
        with pytest.raises(SystemExit) as e:
            generate(str(llama_dir), *method, *flags)
        assert str(e.value.code) == (
            f"error: {' '.join(flags)} is given, but --method is none: name the drafter with --method"
        )


def test_num_steps_past_the_rows_a_draft_may_reach_is_refused_before_the_drafter_is_built(
    no_target_load,
):
    """--num-steps 1000000 got past SpeculativeConfig and ended in the allocator's RuntimeError traceback when the
    drafter sized its buffers (the engine's check of the rows drafts reach came after them)."""
    with pytest.raises(SystemExit) as e:
        generate("--method", "eagle3", "--num-steps", "1000000")
    assert str(e.value.code).startswith(
        "error: SpeculativeConfig.num_steps=1000000 is invalid: must be an integer in [1, 63]"
    ), e.value.code
    assert SpeculativeConfig("ngram", num_steps=63).num_steps == 63
