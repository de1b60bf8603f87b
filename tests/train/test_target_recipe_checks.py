"""``outpace train target`` and the family targets (train/family_targets.py) given bad input: every recipe field
of the wrong type or out of range is refused by name when the recipe is built, and a bad --out before the corpus
is read, as the draft recipes refuse theirs (tests/train/test_train_bad_inputs.py).

Each case here was a defect: a value taken as it came (``steps=0`` trained nothing and crashed on the empty
loss curve, ``lr=nan`` trained to NaN, ``heldout_fraction=0`` divided by zero after the whole loop,
``--reproduce-steps 0`` trained the full recipe), a traceback from inside torch or transformers, or a finished
run's files written over a file, or over the zoo target whose tokenizer a family run reads."""

import sysconfig
from pathlib import Path

import pytest

from outpace.cli import main as cli_main
from outpace.train import family_targets
from outpace.train.family_targets import RECIPES
from outpace.train.target import TargetRecipe, reproducibility_check, train_target

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SMALL_CORPUS = (str(Path(sysconfig.get_paths()["stdlib"]) / "json"),)


def no_work(*args, **kwargs):
    raise AssertionError("the run read its corpus before refusing its input")


def test_every_recipe_as_shipped_passes_its_checks():
    TargetRecipe()
    TargetRecipe.toy()
    for recipe in RECIPES.values():
        assert family_targets.hf_config(recipe.toy(), 0, 1)["architectures"] == [
            recipe.architecture
        ]


# ---------------------------------------------------------------------------------------------
# Recipe fields

# fields TargetRecipe and FamilyRecipe share (train/target.py check_model_fields)
SHARED_FIELDS = [
    ("steps", 0),
    ("steps", -3),
    ("steps", 1.5),
    ("steps", "10"),
    ("lr", 0.0),
    ("lr", -1e-3),
    ("lr", float("nan")),
    ("lr", float("inf")),
    ("lr", "abc"),
    ("warmup_steps", -1),
    ("batch_size", 0),
    ("seq_len", 0),
    ("seq_len", 100_000),  # beyond max_position_embeddings
    ("max_minutes", 0.0),
    ("max_minutes", -1.0),
    ("max_minutes", float("nan")),
    ("seed", -1),
    ("seed", "7"),
    ("vocab_size", 0),
    ("hidden_size", 0),
    ("intermediate_size", 0),
    ("num_layers", 0),
    ("num_heads", 0),
    ("num_kv_heads", 0),
    ("num_kv_heads", 3),  # num_heads (4, 2) not a multiple of it
    ("num_mtp_layers", -1),
    ("mtp_loss_weight", -0.1),
    ("mtp_loss_weight", float("nan")),
    ("heldout_fraction", 0.0),
    ("heldout_fraction", 1.0),
    ("max_corpus_bytes", 0),
    ("eval_windows", 0),
    ("chain_mtp", 1),
    ("chain_mtp", "yes"),
]
TARGET_FIELDS = [
    ("vocab_size", 100),  # fewer than the tokenizer's specials and 256 bytes
    ("hidden_size", 30),  # not a multiple of num_heads (4)
    ("hidden_size", 12),  # head size 3: odd, no rotary pairs
    ("num_mtp_layers", 0),  # the loss averages the MTP layers'
    ("tokenizer_sample_bytes", 0),
]
FAMILY_FIELDS = [
    ("architecture", "LlamaForCausalLM"),
    ("q_lora_rank", 0),
    ("kv_lora_rank", 0),
    ("qk_nope_head_dim", 0),
    ("qk_rope_head_dim", 0),
    ("qk_rope_head_dim", 7),
    ("v_head_dim", 0),
    ("n_routed_experts", 0),
    ("n_routed_experts", 5),  # not a multiple of n_group (2)
    ("num_experts_per_tok", 0),
    ("num_experts_per_tok", 3),  # more than the experts of the kept groups (1 x 2)
    ("n_group", 0),
    ("topk_group", 0),
    ("topk_group", 3),  # more than n_group (2)
    ("moe_intermediate_size", 0),
    ("n_shared_experts", -1),
    ("first_k_dense_replace", -1),
    ("first_k_dense_replace", 4),  # more than num_layers (3)
    ("bias_update_speed", -1e-3),
    ("bias_update_speed", float("inf")),
    ("head_dim", 0),
    ("head_dim", 15),
    ("sliding_window", 0),
    ("sliding_window_pattern", 0),
    ("linear_num_key_heads", 0),
    ("linear_num_value_heads", 0),
    ("linear_num_value_heads", 3),  # not a multiple of linear_num_key_heads (2)
    ("linear_key_head_dim", 0),
    ("linear_value_head_dim", 0),
    ("full_attention_interval", 0),
]
QWEN35_FIELDS = [("partial_rotary_factor", 0.0), ("partial_rotary_factor", 1.5)]


def ids(cases):
    return [f"{f}={v!r}" for f, v in cases]


@pytest.mark.parametrize(
    "field,value", SHARED_FIELDS + TARGET_FIELDS, ids=ids(SHARED_FIELDS + TARGET_FIELDS)
)
def test_a_target_field_out_of_range_or_of_the_wrong_type_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"TargetRecipe\.{field}=.* is invalid: must be"):
        TargetRecipe.toy(**{field: value})


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize(
    "field,value", SHARED_FIELDS + FAMILY_FIELDS, ids=ids(SHARED_FIELDS + FAMILY_FIELDS)
)
def test_a_family_field_out_of_range_or_of_the_wrong_type_is_refused_by_name(name, field, value):
    with pytest.raises(ValueError, match=rf"FamilyRecipe\.{field}=.* is invalid: must be"):
        RECIPES[name].toy(**{field: value})


@pytest.mark.parametrize("field,value", QWEN35_FIELDS, ids=ids(QWEN35_FIELDS))
def test_a_qwen35_rotary_fraction_out_of_range_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"FamilyRecipe\.{field}=.* is invalid: must be"):
        RECIPES["tinyqwen35"].toy(**{field: value})


def test_a_family_vocabulary_smaller_than_the_tokenizer_is_refused_before_the_corpus(
    tmp_path, monkeypatch
):
    """The zoo tokenizer's ids past the embedding's rows failed inside the first forward."""
    monkeypatch.setattr(family_targets, "build_corpus", no_work)
    recipe = RECIPES["tinygemma"].toy(vocab_size=300)
    with pytest.raises(
        ValueError, match=r"FamilyRecipe\.vocab_size=300 is invalid: must be >= the 4096"
    ):
        family_targets.train_family_target(recipe, tmp_path / "out", "cpu", roots=SMALL_CORPUS)


# ---------------------------------------------------------------------------------------------
# The command's flags

TARGET_FLAGS = [
    (["--steps", "0"], r"TargetRecipe\.steps=0 is invalid"),
    (["--max-minutes", "-1"], r"TargetRecipe\.max_minutes=-1\.0 is invalid"),
    (["--seed", "-1"], r"TargetRecipe\.seed=-1 is invalid"),
    (["--set", "lr=abc"], r"TargetRecipe\.lr='abc' is invalid: must be a number"),
    (["--set", "warmup_steps=-2"], r"TargetRecipe\.warmup_steps=-2 is invalid"),
    (["--set", "heldout_fraction=0"], r"TargetRecipe\.heldout_fraction=0 is invalid"),
    (["--set", "no_such_field=1"], r"TargetRecipe: .*no_such_field"),
    (["--set", "steps"], r"--set 'steps': expected FIELD=VALUE"),
    (["--reproduce-steps", "0"], r"--reproduce-steps 0 is invalid: must be an integer >= 1"),
    (["--reproduce-steps", "-2"], r"--reproduce-steps -2 is invalid"),
]


@pytest.mark.parametrize("flags,error", TARGET_FLAGS, ids=[" ".join(f) for f, _ in TARGET_FLAGS])
def test_the_command_refuses_flags_by_name_before_any_work(tmp_path, monkeypatch, flags, error):
    monkeypatch.setattr("outpace.train.target.build_corpus", no_work)
    argv = ["train", "target", "--toy", "--device", "cpu", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=error):
        cli_main([*argv, *flags])


def test_the_family_script_refuses_a_field_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(family_targets, "build_corpus", no_work)
    with pytest.raises(SystemExit, match=r"error: FamilyRecipe\.steps=0 is invalid"):
        family_targets.main(["tinygemma", "--out", str(tmp_path / "out"), "--steps", "0"])


# ---------------------------------------------------------------------------------------------
# --out, checked before the corpus is read


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    return path


OUT_CASES = [
    ("file", lambda tmp: a_file(tmp), r"--out .*a_file: exists and is not a directory"),
    (
        "under a file",
        lambda tmp: a_file(tmp) / "out",
        r"--out .*a_file.* is not a writable directory",
    ),
    (
        "a corpus root",
        lambda tmp: Path(SMALL_CORPUS[0]),
        r"--out .*json must differ from the corpus root",
    ),
]


@pytest.mark.parametrize("what,out,error", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_a_bad_target_out_is_refused_before_the_corpus(tmp_path, monkeypatch, what, out, error):
    monkeypatch.setattr("outpace.train.target.build_corpus", no_work)
    with pytest.raises(ValueError, match=error):
        train_target(TargetRecipe.toy(), out(tmp_path), "cpu", roots=SMALL_CORPUS)


@pytest.mark.parametrize("what,out,error", OUT_CASES[:2], ids=[c[0] for c in OUT_CASES[:2]])
def test_a_bad_reproducibility_out_is_refused_before_the_corpus(
    tmp_path, monkeypatch, what, out, error
):
    monkeypatch.setattr("outpace.train.target.build_corpus", no_work)
    with pytest.raises(ValueError, match=error):
        reproducibility_check(TargetRecipe.toy(), 2, "cpu", out(tmp_path))


@pytest.mark.parametrize("what,out,error", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_a_bad_family_out_is_refused_before_the_corpus(tmp_path, monkeypatch, what, out, error):
    monkeypatch.setattr(family_targets, "build_corpus", no_work)
    recipe = RECIPES["tinygemma"].toy()
    with pytest.raises(ValueError, match=error):
        family_targets.train_family_target(recipe, out(tmp_path), "cpu", roots=SMALL_CORPUS)


def test_a_family_out_that_is_the_tokenizers_directory_is_refused(tmp_path, monkeypatch):
    """A family run with --out the zoo target's directory (whose tokenizer it reads) would write its config.json,
    weights and tokenizer files over the target's."""
    monkeypatch.setattr(family_targets, "build_corpus", no_work)
    tinypy = ZOO / "tinypy"
    before = {f.name: f.stat().st_mtime_ns for f in tinypy.iterdir()}
    with pytest.raises(
        ValueError, match=r"--out .*tinypy must differ from the tokenizer's directory"
    ):
        family_targets.train_family_target(
            RECIPES["tinygemma"].toy(), tinypy, "cpu", tokenizer_dir=tinypy, roots=SMALL_CORPUS
        )
    assert {f.name: f.stat().st_mtime_ns for f in tinypy.iterdir()} == before


def test_a_family_target_without_mtp_layers_trains(tmp_path):
    """tinygemma (num_mtp_layers 0) failed at its first step: the loss asked the model for its MTP layers."""
    recipe = RECIPES["tinygemma"].toy(steps=2, eval_windows=2)
    out = tmp_path / "tinygemma"
    metrics = family_targets.train_family_target(
        recipe, out, "cpu", roots=SMALL_CORPUS, num_samples=1
    )
    assert metrics["steps_run"] == 2 and metrics["mtp_heldout_top1"] == {}
    assert (out / "config.json").is_file()
