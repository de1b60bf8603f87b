"""``outpace train draft`` given bad input: every refusal names the file, field or flag, and comes before the
target generates any data; nothing the user did not ask to change is written over; a run resumes only from a
state (and cached data) of the same method, target and recipe.

Each case here was a defect: a traceback from inside torch or jinja, a value silently ignored, the target's
own files overwritten by the draft's, or another run's weights or continuations read back."""

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from outpace.cli import main as cli_main
from outpace.train.prompts import load_prompt_ids
from outpace.train.recipes.dflash import DFlashRecipe, train_dflash
from outpace.train.recipes.eagle3 import Eagle3Recipe, train_eagle3
from outpace.train.recipes.mtp import MTPRecipe, train_mtp
from outpace.train.recipes.standalone import StandaloneRecipe, train_standalone

ZOO = Path(__file__).resolve().parents[2] / "zoo"
# the corpus of one stdlib package: the default reads the whole stdlib and site-packages on every run
SMALL_CORPUS = (str(Path(sysconfig.get_paths()["stdlib"]) / "json"),)


def no_generation(*args, **kwargs):
    raise AssertionError("the run generated data before refusing its input")


# ---------------------------------------------------------------------------------------------
# --data files


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


BAD_RECORDS = [
    ("bad.jsonl", "{not json\n", r"bad\.jsonl:1: not a JSON record"),
    (
        "role.jsonl",
        json.dumps(
            {"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]}
        ),
        r"role\.jsonl:1: turn 1 has role 'wizard'",
    ),
    (
        "norole.jsonl",
        json.dumps({"messages": [{"content": "a"}]}),
        r"norole\.jsonl:1: turn 0 has role None",
    ),
    ("turn.jsonl", json.dumps({"messages": ["hi"]}), r"turn\.jsonl:1: turn 0 must be an object"),
    (
        "content.jsonl",
        json.dumps({"messages": [{"role": "user", "content": 5}]}),
        r"content\.jsonl:1: turn 0's content must be a string",
    ),
    (
        "emptyturn.jsonl",
        "\n" + json.dumps({"messages": [{"role": "user", "content": " "}]}),
        r"emptyturn\.jsonl:2: the conversation's last user turn \(turn 0\) is empty",
    ),
    (
        "nouser.jsonl",
        json.dumps({"conversations": [{"from": "gpt", "value": "hi"}]}),
        r"nouser\.jsonl:1: the conversation has no user turn",
    ),
    ("emptyprompt.jsonl", json.dumps({"prompt": ""}), r"emptyprompt\.jsonl:1: the prompt is empty"),
    (
        "intprompt.jsonl",
        json.dumps({"prompt": 5}),
        r"intprompt\.jsonl:1: field 'prompt' must be a string",
    ),
    (
        "msgs.jsonl",
        json.dumps({"messages": "hi"}),
        r"msgs\.jsonl:1: field 'messages' must be a list",
    ),
    (
        "template.jsonl",  # the zoo's chat template refuses a tool turn: jinja's error, named
        json.dumps(
            {"messages": [{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}]}
        ),
        r"template\.jsonl:1: the target's chat template cannot render this conversation",
    ),
    ("binary.jsonl", b"\xff\xfe\x00bad", r"binary\.jsonl: not UTF-8 text"),
    ("binary.txt", b"\xff\xfe\x00bad", r"binary\.txt: not UTF-8 text"),
    ("obj.json", json.dumps({"prompt": "a"}), r"obj\.json: a \.json prompt file must hold a list"),
    ("bad.json", "[1, 2", r"bad\.json: not JSON"),
    ("rec.json", json.dumps(["def f():", {"foo": 1}]), r"rec\.json\[1\]: no prompt found"),
]


@pytest.mark.parametrize("name,text,error", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_a_bad_prompt_record_is_refused_naming_its_file_and_line(tmp_path, name, text, error):
    with pytest.raises(ValueError, match=error):
        load_prompt_ids([write(tmp_path / name, text)], ZOO / "tinypy", prompt_len=8, num=4)


def test_a_directory_is_not_a_prompt_file(tmp_path):
    with pytest.raises(ValueError, match="--data .*: not a file"):
        load_prompt_ids([tmp_path], ZOO / "tinypy", prompt_len=8, num=4)


def test_a_json_file_is_a_list_of_records_not_plain_text(tmp_path):
    """A .json file (ShareGPT's are one) was read as plain text: its JSON syntax became the prompts."""
    from transformers import AutoTokenizer

    records = [{"conversations": [{"from": "human", "value": "sort a list"}]}, "def f(x):"]
    path = write(tmp_path / "share.json", json.dumps(records))
    prompts = load_prompt_ids([path], ZOO / "tinypy", prompt_len=64, num=4)
    tok = AutoTokenizer.from_pretrained(str(ZOO / "tinypy"))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "sort a list"}], tokenize=False, add_generation_prompt=True
    )
    assert prompts == [
        tok.encode(chat, add_special_tokens=False),
        tok.encode("def f(x):", add_special_tokens=False),
    ]


# ---------------------------------------------------------------------------------------------
# Recipe fields and flags

BAD_FIELDS = [
    ("steps", 0),
    ("steps", -3),
    ("steps", 1.5),
    ("lr", 0.0),
    ("lr", -1e-3),
    ("lr", float("nan")),
    ("lr", float("inf")),
    ("lr", "abc"),
    ("warmup_steps", -1),
    ("batch_size", 0),
    ("num_continuations", 0),
    ("prompt_len", 0),
    ("new_tokens", 0),
    ("max_minutes", 0.0),
    ("max_minutes", -1.0),
    ("seed", -1),
    ("seed", "7"),
    ("generation_batch", 0),
    ("resume_every", 0),
    ("data_temperature", -0.5),
    ("eval_max_tokens", 0),
    ("eval_num_prompts", 0),
    ("max_corpus_bytes", 0),
    ("compile_step", "yes"),
    ("compile_step", 1),
    ("corpus_roots", "/some/dir"),
    ("corpus_roots", ()),
    ("prompt_files", ()),
]
RECIPES = [Eagle3Recipe, DFlashRecipe, MTPRecipe, StandaloneRecipe]


@pytest.mark.parametrize("recipe_cls", RECIPES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_a_field_out_of_range_or_of_the_wrong_type_is_refused_by_name(recipe_cls, field, value):
    with pytest.raises(ValueError, match=rf"{recipe_cls.__name__}\.{field}="):
        recipe_cls.toy(**{field: value})


OWN_FIELDS = [
    (Eagle3Recipe, "ttt_steps", 0),
    (Eagle3Recipe, "intermediate_size", 0),
    (Eagle3Recipe, "aux_layer_ids", ()),
    (Eagle3Recipe, "eval_num_steps", 0),
    (Eagle3Recipe, "soft_labels", 0),
    (Eagle3Recipe, "step_decay", "nan"),
    (DFlashRecipe, "intermediate_size", 0),
    (DFlashRecipe, "target_layer_ids", ()),
    (DFlashRecipe, "target_layer_ids", ("1",)),
    (MTPRecipe, "num_layers", 0),
    (StandaloneRecipe, "num_layers", 0),
    (StandaloneRecipe, "num_heads", 0),
    (StandaloneRecipe, "hidden_size", 30),  # not a multiple of num_heads (4)
    (StandaloneRecipe, "num_kv_heads", 3),  # num_heads (4) not a multiple of it
]


@pytest.mark.parametrize(
    "recipe_cls,field,value", OWN_FIELDS, ids=[f"{c.__name__}.{f}={v!r}" for c, f, v in OWN_FIELDS]
)
def test_a_recipe_refuses_its_own_fields_by_name(recipe_cls, field, value):
    with pytest.raises(ValueError, match=rf"{recipe_cls.__name__}\.{field}="):
        recipe_cls.toy(**{field: value})


@pytest.mark.parametrize(
    "flags,error",
    [
        (["--steps", "0"], r"Eagle3Recipe\.steps=0"),
        (["--max-minutes", "-1"], r"Eagle3Recipe\.max_minutes=-1"),
        (["--num-continuations", "0"], r"Eagle3Recipe\.num_continuations=0"),
        (["--set", "lr=abc"], r"Eagle3Recipe\.lr='abc' is invalid: must be a number"),
        (["--set", "warmup_steps=-2"], r"Eagle3Recipe\.warmup_steps=-2"),
        (["--set", "ttt_steps=0"], r"Eagle3Recipe\.ttt_steps=0"),
    ],
)
def test_the_command_refuses_flags_by_name_before_any_data(tmp_path, monkeypatch, flags, error):
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    argv = ["train", "draft", "--method", "eagle3", "--target", str(ZOO / "tinypy")]
    with pytest.raises(SystemExit, match=error):
        cli_main([*argv, "--out", str(tmp_path / "out"), "--device", "cpu", "--toy", *flags])


# ---------------------------------------------------------------------------------------------
# What a run reads and writes, checked before its data


@pytest.mark.parametrize(
    "train_fn,recipe_cls",
    [
        (train_eagle3, Eagle3Recipe),
        (train_dflash, DFlashRecipe),
        (train_standalone, StandaloneRecipe),
        (train_mtp, MTPRecipe),
    ],
)
def test_out_that_is_the_target_is_refused_and_the_target_is_untouched(
    tmp_path, monkeypatch, train_fn, recipe_cls
):
    """An EAGLE3, DFlash or standalone run with --out the target's directory wrote its config.json and weights
    over the target's."""
    target = shutil.copytree(ZOO / "tinypy", tmp_path / "target")
    before = {f.name: f.read_bytes() for f in target.iterdir()}
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    with pytest.raises(ValueError, match="--out .* must differ from --target"):
        train_fn(target, recipe_cls.toy(corpus_roots=SMALL_CORPUS), target, "cpu")
    assert {f.name: f.read_bytes() for f in target.iterdir()} == before


def test_out_that_is_a_file_is_refused_before_any_data(tmp_path, monkeypatch):
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    out = write(tmp_path / "out", "a file")
    with pytest.raises(ValueError, match="--out .*out: exists and is not a directory"):
        train_eagle3(ZOO / "tinypy", Eagle3Recipe.toy(corpus_roots=SMALL_CORPUS), out, "cpu")


def test_mtp_for_a_target_without_mtp_layers_is_refused_before_any_data(tmp_path, monkeypatch):
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    with pytest.raises(ValueError, match="tinygemma has none"):
        train_mtp(
            ZOO / "tinygemma", MTPRecipe.toy(corpus_roots=SMALL_CORPUS), tmp_path / "o", "cpu"
        )
    with pytest.raises(ValueError, match=r"MTPRecipe\.num_layers=4 is invalid: the target has 3"):
        train_mtp(
            ZOO / "tinypy",
            MTPRecipe.toy(num_layers=4, corpus_roots=SMALL_CORPUS),
            tmp_path / "o",
            "cpu",
        )


@pytest.mark.parametrize(
    "content,error",
    [
        (None, "no such file"),
        ("[1, 2", "not JSON"),
        ('{"prompts": []}', "must be a non-empty JSON list of non-empty strings"),
        ("[3]", "must be a non-empty JSON list of non-empty strings"),
    ],
)
def test_bad_held_out_prompts_are_refused_before_training(tmp_path, monkeypatch, content, error):
    """A missing or malformed --eval-prompts file was read only after the whole training loop."""
    path = tmp_path / "eval.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    recipe = Eagle3Recipe.toy(eval_prompts=str(path), corpus_roots=SMALL_CORPUS)
    with pytest.raises(
        (ValueError, FileNotFoundError), match=rf"eval_prompts\) .*eval\.json: {error}"
    ):
        train_eagle3(ZOO / "tinypy", recipe, tmp_path / "out", "cpu")


def test_a_missing_prompt_file_or_corpus_directory_is_refused_before_any_data(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    recipe = Eagle3Recipe.toy(
        prompt_files=(str(tmp_path / "nope.jsonl"),), corpus_roots=SMALL_CORPUS
    )
    with pytest.raises(FileNotFoundError, match="--data .*nope.jsonl: no such file"):
        train_eagle3(ZOO / "tinypy", recipe, tmp_path / "out", "cpu")
    recipe = Eagle3Recipe.toy(corpus_roots=(str(tmp_path / "nowhere"),))
    with pytest.raises(FileNotFoundError, match=r"Eagle3Recipe\.corpus_roots: .*nowhere"):
        train_eagle3(ZOO / "tinypy", recipe, tmp_path / "out", "cpu")


# ---------------------------------------------------------------------------------------------
# Resuming from another run's state


@pytest.fixture(scope="module")
def stopped_eagle3(peaked_target, tmp_path_factory):
    """An EAGLE3 toy run for ``peaked_target`` stopped after its state was saved at step 2: its --out holds
    resume/state.pt and resume/data.pt."""
    import outpace.train.recipes.eagle3 as recipe_module

    out = tmp_path_factory.mktemp("stopped_eagle3")
    recipe = Eagle3Recipe.toy(
        resume_every=2,
        steps=6,
        eval_prompts=None,
        corpus_roots=SMALL_CORPUS,
        aux_layer_ids=(0, 2, 3),  # (the target has 3 layers: too shallow for the default capture)
    )
    original, calls = recipe_module.ttt_losses, {"n": 0}

    def stopping(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    recipe_module.ttt_losses = stopping
    try:
        with pytest.raises(KeyboardInterrupt):
            train_eagle3(peaked_target, recipe, out, "cpu")
    finally:
        recipe_module.ttt_losses = original
    assert (out / "resume" / "state.pt").is_file() and (out / "resume" / "data.pt").is_file()
    return peaked_target, out, recipe


def copy_of(out: Path, tmp_path: Path) -> Path:
    return shutil.copytree(out, tmp_path / "out")


def test_a_state_of_another_draft_kind_is_refused(stopped_eagle3, tmp_path, monkeypatch):
    """A DFlash run into the stopped EAGLE3 run's --out loaded (or crashed on) the EAGLE3 draft's state."""
    target, out, recipe = stopped_eagle3
    out = copy_of(out, tmp_path)
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    dflash = DFlashRecipe.toy(
        **{k: getattr(recipe, k) for k in ("new_tokens", "prompt_len", "corpus_roots")},
        data_temperature=recipe.data_temperature,  # the same data: the state is what differs
        resume_every=2,
        steps=6,
        eval_prompts=None,
    )
    with pytest.raises(
        ValueError, match=r"state\.pt holds the training state of another run \(recipe"
    ):
        train_dflash(target, dflash, out, "cpu")


def test_data_of_another_target_is_refused(stopped_eagle3, tmp_path, monkeypatch):
    """A run for another target with the same tokenizer size read the stopped run's continuations: the draft
    trained on text the target never wrote."""
    target, out, recipe = stopped_eagle3
    out = copy_of(out, tmp_path)
    other = shutil.copytree(target, tmp_path / "other_target")
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    with pytest.raises(
        ValueError, match=r"data\.pt holds the continuations of another run \(target"
    ):
        train_eagle3(other, recipe, out, "cpu")


def test_a_changed_recipe_is_refused_on_resuming(stopped_eagle3, tmp_path, monkeypatch):
    """A resumed run kept the saved run's step count and generator: a new --steps or --seed was silently
    ignored, a changed learning rate silently mixed into one curve."""
    target, out, recipe = stopped_eagle3
    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    for changes, error in (
        (dict(steps=8), r"state\.pt .*another run \(steps 6 there, 8 now\)"),
        (dict(lr=3e-3), r"state\.pt .*another run \(lr 0\.01 there, 0\.003 now\)"),
        (dict(seed=1), r"data\.pt .*another run \(seed 0 there, 1 now\)"),
    ):
        copy = shutil.copytree(out, tmp_path / f"out_{next(iter(changes))}")
        with pytest.raises(ValueError, match=error):
            train_eagle3(target, Eagle3Recipe(**{**vars(recipe), **changes}), copy, "cpu")


def test_a_run_resumes_with_a_new_budget_and_equals_the_uninterrupted_one(stopped_eagle3, tmp_path):
    """What may change on resuming (the budget, how often it saves, its evaluation) does, and the resumed
    draft equals the uninterrupted run's."""
    from safetensors.torch import load_file

    target, out, recipe = stopped_eagle3
    resumed = copy_of(out, tmp_path)
    metrics = train_eagle3(
        target,
        Eagle3Recipe(**{**vars(recipe), "resume_every": 3, "max_minutes": 30.0}),
        resumed,
        "cpu",
    )
    assert metrics["history"]["resumed_from_step"] == 2
    whole = tmp_path / "whole"
    train_eagle3(target, recipe, whole, "cpu")
    a, b = load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
