"""A standalone draft's tokenizer.json, compared with the target's (speculative/drafters/draft_model.py
``shared_vocab_size``): a file of another shape is refused naming it and the field, where it once failed as a bare
KeyError or TypeError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from outpace.speculative.drafters.draft_model import shared_vocab_size
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def damaged(tokenizer: dict, case: str) -> tuple[dict, str]:
    """The tokenizer.json damaged as ``case`` says, and the field its refusal names."""
    if case == "no model":
        return {k: v for k, v in tokenizer.items() if k != "model"}, "'model'"
    if case == "vocab a string":
        return {**tokenizer, "model": {**tokenizer["model"], "vocab": "x"}}, "'model.vocab'"
    if case == "vocab ids strings":
        vocab = {token: str(i) for token, i in tokenizer["model"]["vocab"].items()}
        return {**tokenizer, "model": {**tokenizer["model"], "vocab": vocab}}, "'model.vocab'"
    if case == "added token without id":
        added = [{"content": "<x>"}]
        return {**tokenizer, "added_tokens": added}, "'added_tokens'"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case", ["no model", "vocab a string", "vocab ids strings", "added token without id"]
)
def test_a_draft_tokenizer_of_another_shape_is_refused_naming_the_file(case, tmp_path):
    draft = shutil.copytree(ZOO / "tinypy-draft", tmp_path / "draft")
    path = draft / "tokenizer.json"
    broken, field = damaged(json.loads(path.read_text()), case)
    path.write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match=f"{path}: field {field}"):
        shared_vocab_size(ZOO / "tinypy", draft)


def test_the_zoo_draft_shares_its_targets_tokenizer():
    """The ids a draft may propose: the tokenizer's, up to its largest id (added tokens included)."""
    tokenizer = json.loads((ZOO / "tinypy" / "tokenizer.json").read_text())
    ids = [*tokenizer["model"]["vocab"].values(), *(t["id"] for t in tokenizer["added_tokens"])]
    assert shared_vocab_size(ZOO / "tinypy", ZOO / "tinypy-draft") == max(ids) + 1
