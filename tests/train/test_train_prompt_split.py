"""The distillation recipes' ``prompt_split``: draft prompts and raw corpus windows from the corpus's train split
(the default, as before) or from its held-out files less those that an evaluation prompt was cut from
(train/distill.py, train/corpus.py), on a hand-made corpus whose three kinds of file use disjoint characters."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from outpace.cli import main
from outpace.train.corpus import (
    Corpus,
    SourceFile,
    files_holding_prompts,
    heldout_files_unused_by,
    heldout_prompts,
)
from outpace.train.data import TokenStream
from outpace.train.distill import DistillData, DistillRecipe, unused_files_note
from outpace.train.recipes.eagle3 import Eagle3Recipe
from outpace.train.tokenizer import EOS_TOKEN

TARGET = Path(__file__).resolve().parents[2] / "zoo" / "tinypy"  # only its tokenizer is read
TRAIN_CHARS = "0123456789"  # train-split files
EVAL_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # held-out files that the evaluation prompts are cut from
KEPT_CHARS = "abcdefghijklmnopqrstuvwxyz"  # the other held-out files


def _line(chars: str, rng: random.Random) -> str:
    """A Python-shaped line (maybe indented) of 8 words made of ``chars`` only, at least 31 characters long."""
    words = ("".join(rng.choice(chars) for _ in range(rng.randint(3, 8))) for _ in range(8))
    return "    " * rng.randint(0, 1) + " ".join(words)


def _text(chars: str, seed: int, lines: int = 30) -> str:
    rng = random.Random(seed)
    return "".join(_line(chars, rng) + "\n" for _ in range(lines))


def _changed_line(text: str, line: str) -> str:
    """``text`` with ``line`` replaced by another line of EVAL_CHARS words: the same file in another version."""
    lines = text.split("\n")
    lines[lines.index(line)] = _line(EVAL_CHARS, random.Random(99))
    return "\n".join(lines)


# the held-out files that the evaluation prompts are cut from, as they were where the prompts were cut
EVAL_SOURCES = [
    SourceFile("evalA.py", _text(EVAL_CHARS, 20)),
    SourceFile("evalB.py", _text(EVAL_CHARS, 21)),
]
EVAL_PROMPTS = heldout_prompts(
    Corpus(train=[], heldout=EVAL_SOURCES), 2, prompt_chars=600, seed=1
)  # one each


@pytest.fixture
def corpus():
    """Two train files, four kept held-out files, and the two that the evaluation prompts come from: evalB as
    another version, with the second line of its prompt changed (so that prompt is not in it as it is)."""
    prompt_b = next(p for p in EVAL_PROMPTS if p in EVAL_SOURCES[1].text)
    eval_b = SourceFile("evalB.py", _changed_line(EVAL_SOURCES[1].text, prompt_b.split("\n")[1]))
    assert prompt_b.strip() not in eval_b.text
    return Corpus(
        train=[SourceFile(f"train{i}.py", _text(TRAIN_CHARS, i)) for i in range(2)],
        heldout=sorted(
            [SourceFile(f"kept{i}.py", _text(KEPT_CHARS, 10 + i)) for i in range(4)]
            + [EVAL_SOURCES[0], eval_b],
            key=lambda f: f.rel_path,
        ),
    )


@pytest.fixture
def eval_prompts(tmp_path):
    """The evaluation prompts file, in the zoo's form."""
    path = tmp_path / "eval_prompts.json"
    path.write_text(json.dumps({"source": "EVAL_SOURCES", "prompts": EVAL_PROMPTS}))
    return path


@pytest.fixture
def generated(monkeypatch, corpus):
    """Corpus building returns ``corpus``; the target's generation is skipped: each prompt is padded to its row
    with zeros, and the prompts are kept in the list returned."""
    prompts: list[list[int]] = []

    def padded(target_dir, batch, seq_len, *args, **kwargs):
        prompts.extend(batch)
        return torch.tensor([p + [0] * (seq_len - len(p)) for p in batch], dtype=torch.int64)

    monkeypatch.setattr("outpace.train.distill.build_corpus", lambda *args, **kwargs: corpus)
    monkeypatch.setattr("outpace.train.distill.target_continuations", padded)
    return prompts


def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TARGET / "tokenizer.json"))


def _texts(rows) -> list[str]:
    tok = _tokenizer()
    return [tok.decode([int(i) for i in row]) for row in rows]


def _recipe(**fields) -> DistillRecipe:
    return DistillRecipe(
        num_continuations=64, prompt_len=8, new_tokens=8, corpus_fraction=0.5, **fields
    )


def test_heldout_split_uses_only_heldout_files_no_eval_prompt_came_from(
    generated, corpus, eval_prompts
):
    data = DistillData.for_recipe(
        TARGET, _recipe(prompt_split="heldout", eval_prompts=str(eval_prompts)), "cpu"
    )
    kept = [f for f in corpus.heldout if f.rel_path.startswith("kept")]
    assert data.heldout_corpus["excluded_files"] == [
        "evalA.py",
        "evalB.py",
    ]  # evalB by its lines: not exact
    assert data.heldout_corpus["files"] == len(kept) and data.corpus_metrics == {
        "heldout_corpus": data.heldout_corpus
    }
    # the stream that prompts and windows are cut from is the kept files, back to back, each followed by EOS
    assert _texts([data.stream.tokens]) == ["".join(f.text for f in kept)]
    assert (data.stream.tokens == _tokenizer().token_to_id(EOS_TOKEN)).sum() == len(kept)
    batch = data.batch(16, torch.Generator().manual_seed(0))[
        data.num_corpus_rows(16) :
    ]  # the raw windows
    texts = _texts(generated) + _texts(batch)
    assert len(generated) == 64 and batch.shape == (8, 16)
    assert not [t for t in texts if re.search(f"[{TRAIN_CHARS}{EVAL_CHARS}]", t)]
    assert all(re.search(f"[{KEPT_CHARS}]", t) for t in texts)


def test_train_split_gives_the_same_prompts_and_windows_as_before(generated, corpus, eval_prompts):
    """The default is the train split, bit for bit: windows of the train files' stream drawn as they always were."""
    recipe = _recipe(eval_prompts=str(eval_prompts))
    assert recipe.prompt_split == "train"
    data = DistillData.for_recipe(TARGET, recipe, "cpu")
    tok = _tokenizer()
    stream = TokenStream.from_files(corpus.train, tok, tok.token_to_id(EOS_TOKEN))
    assert generated == stream.windows(64, 8, torch.Generator().manual_seed(recipe.seed)).tolist()
    assert data.heldout_corpus is None and data.corpus_metrics == {}
    g, expected = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    torch.randint(0, 64, (8,), generator=expected)  # the continuation rows come first
    assert torch.equal(data.batch(16, g)[8:], stream.windows(8, 16, expected))
    assert all(re.fullmatch(f"[{TRAIN_CHARS} \n]*", t) for t in _texts(generated))


def test_eval_prompt_files_are_found_exactly_or_by_most_of_their_long_lines():
    original = _text(EVAL_CHARS, 0)
    cut = original.split("\n")[4:10]
    prompt = "\n" + "\n".join(cut) + "\n\n"  # surrounding whitespace is stripped
    longest = max(cut, key=lambda line: len(line.strip()))
    files = [
        SourceFile("same.py", original),
        SourceFile("other_version.py", _changed_line(original, longest)),
        SourceFile("one_line_shared.py", _text(KEPT_CHARS, 1) + longest.strip() + "\n"),
        SourceFile("unrelated.py", _text(KEPT_CHARS, 2)),
    ]
    assert files_holding_prompts(files, [prompt]) == {"same.py"}  # exact matches win
    assert files_holding_prompts(files[1:], [prompt]) == {
        "other_version.py"
    }  # 2 of its 3 longest lines
    assert files_holding_prompts(files[2:], [prompt, "   "]) == set()


def test_heldout_files_are_capped_like_the_train_split(corpus):
    size = len(corpus.heldout[0].text.encode("utf-8"))
    files, excluded = heldout_files_unused_by(
        corpus, [], max_total_bytes=size + 1
    )  # reached by the 2nd file
    assert [f.rel_path for f in files] == [
        f.rel_path for f in corpus.heldout[:2]
    ] and excluded == []


def test_refusals(generated, corpus, eval_prompts, tmp_path):
    with pytest.raises(
        ValueError, match="prompt_split='validation' is invalid: must be one of train, heldout"
    ):
        DistillRecipe(prompt_split="validation")
    with pytest.raises(
        ValueError,
        match=r"Eagle3Recipe.prompt_split='heldout' is invalid: .*prompt files \(--data\)",
    ):
        Eagle3Recipe.toy(prompt_split="heldout", prompt_files=("prompts.jsonl",))
    data_file = tmp_path / "prompts.jsonl"
    data_file.write_text('"def f():"\n')
    with pytest.raises(SystemExit, match="prompt_split='heldout' is invalid"):
        main(
            [
                "train",
                "draft",
                "--method",
                "dflash",
                "--target",
                str(TARGET),
                "--toy",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "out"),
                "--data",
                str(data_file),
                "--set",
                "prompt_split=heldout",
            ]
        )
    bare = tmp_path / "bare" / "target"  # no eval_prompts.json beside it
    bare.mkdir(parents=True)
    shutil.copy(TARGET / "tokenizer.json", bare)
    with pytest.raises(ValueError, match=r"none are known: give eval_prompts \(--eval-prompts\)"):
        DistillData.for_recipe(bare, _recipe(prompt_split="heldout"), "cpu")
    everything = tmp_path / "everything.json"  # a prompt from every held-out file
    everything.write_text(json.dumps([f.text for f in corpus.heldout]))
    with pytest.raises(ValueError, match="no held-out file is left"):
        DistillData.for_recipe(
            TARGET, _recipe(prompt_split="heldout", eval_prompts=str(everything)), "cpu"
        )
    assert not generated  # every refusal came before any generation


def test_the_card_says_which_corpus_files_a_run_never_read():
    """The train split never reads held-out files; the held-out split names what it left out; with the user's
    prompt files the card claims nothing about what they hold (they may be held-out text)."""
    heldout = {"eval_prompts": "zoo/eval_prompts.json", "excluded_files": ["a.py", "b.py"]}
    train = unused_files_note({"recipe": {"prompt_files": None, "prompt_split": "train"}})
    held = unused_files_note(
        {"recipe": {"prompt_files": None, "prompt_split": "heldout"}, "heldout_corpus": heldout}
    )
    user = unused_files_note({"recipe": {"prompt_files": ("mine.txt",), "prompt_split": "train"}})
    assert train == "Held-out files are never used."
    assert "2 held-out files" in held and "eval_prompts.json" in held
    assert user == "The corpus's held-out files are not read."
