"""Broken or contradictory draft checkpoints and speculative options are refused by name (the file, field or
tensor), never ignored: copies of the zoo's EAGLE3 and DFlash drafts with one thing changed, loaded against
their zoo targets, and drafter options the Python API would otherwise drop silently."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.layers.embedding import LMHead
from outpace.models.drafts.dflash import load_dflash_draft
from outpace.models.drafts.eagle3 import DraftMismatchError, load_eagle3_draft
from outpace.models.loader import load_model
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"


@pytest.fixture(scope="module")
def tinyds():
    return load_model(ZOO / "tinyds", torch.float32, progress=False)


@pytest.fixture(scope="module")
def tinypy():
    return load_model(ZOO / "tinypy", torch.float32, progress=False)


def broken_copy(tmp_path, name, config=None, tensors=None) -> Path:
    """A copy of zoo/``name`` whose config.json dict and tensor dict the callables edit in place."""
    out = tmp_path / name
    shutil.copytree(ZOO / name, out)
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(out / "model.safetensors")
        tensors(t)
        save_file(t, out / "model.safetensors")
    return out


def set_aux_ids(ids):
    return lambda c: c["eagle_config"].__setitem__("eagle_aux_hidden_state_layer_ids", ids)


# ---- EAGLE3 ---------------------------------------------------------------------------------------


def test_eagle3_with_more_than_one_layer_is_refused(tmp_path, tinyds):
    """num_hidden_layers 2 was read as 1 (the layer count was overwritten): SGLang and vLLM refuse it."""
    d = broken_copy(tmp_path, "tinyds-eagle3", lambda c: c.update(num_hidden_layers=2))
    with pytest.raises(ConfigError, match=r"config\.json: field 'num_hidden_layers' must be 1"):
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")


def test_eagle3_fc_width_against_the_aux_ids_names_them(tmp_path, tinyds):
    """Two aux ids for an fc of three states: named by field, not as a bare tensor-shape error."""
    d = broken_copy(tmp_path, "tinyds-eagle3", set_aux_ids([1, 2]))
    with pytest.raises(
        DraftMismatchError,
        match=r"fc\.weight reads 192 features.*"
        r"eagle_aux_hidden_state_layer_ids \[1, 2\]",
    ):
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")


@pytest.mark.parametrize("size", [1024, 4096])
def test_eagle3_draft_vocab_size_against_its_tensors(tmp_path, tinyds, size):
    d = broken_copy(tmp_path, "tinyds-eagle3", lambda c: c.update(draft_vocab_size=size))
    with pytest.raises(DraftMismatchError, match=rf"draft_vocab_size {size}, but lm_head\.weight"):
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")


def test_eagle3_reduced_vocabulary_without_d2t_is_refused(tmp_path, tinyds):
    """Without d2t every draft id was taken as the target id of the same number: drafts of the wrong tokens."""
    d = broken_copy(tmp_path, "tinyds-eagle3", tensors=lambda t: t.pop("d2t"))
    with pytest.raises(DraftMismatchError, match="no d2t tensor"):
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")


def test_eagle3_t2d_must_agree_with_d2t_and_may_be_absent(tmp_path, tinyds):
    def swap_one(t):
        x = t["t2d"].clone()
        marked, unmarked = x.nonzero()[0], (~x).nonzero()[0]
        x[marked], x[unmarked] = False, True
        t["t2d"] = x

    d = broken_copy(tmp_path, "tinyds-eagle3", tensors=swap_one)
    with pytest.raises(DraftMismatchError, match="d2t and t2d disagree"):
        load_eagle3_draft(d, tinyds, torch.float32, "cpu")
    # t2d is read by no server (SGLang and vLLM skip it): a checkpoint without it loads
    absent = broken_copy(tmp_path / "absent", "tinyds-eagle3", tensors=lambda t: t.pop("t2d"))
    load_eagle3_draft(absent, tinyds, torch.float32, "cpu")


def test_eagle3_tied_head_is_the_embedding_or_refused(tmp_path, tinypy):
    """tie_word_embeddings was ignored: with an lm_head of its own it is ambiguous (refused); without one the
    head is the (borrowed) embedding, as SGLang's LlamaForCausalLMEagle3 reads it, even where the target's
    head is not tied."""
    d = broken_copy(tmp_path, "tinypy-eagle3", lambda c: c.update(tie_word_embeddings=True))
    with pytest.raises(DraftMismatchError, match="tie_word_embeddings is true"):
        load_eagle3_draft(d, tinypy, torch.float32, "cpu")
    headless = broken_copy(
        tmp_path / "headless",
        "tinypy-eagle3",
        lambda c: c.update(tie_word_embeddings=True),
        lambda t: t.pop("lm_head.weight"),
    )
    table = tinypy.model.embed_tokens
    untied = LMHead(table.embedding_dim, tinypy.config.vocab_size)
    with torch.no_grad():
        untied.weight.normal_()
    tinypy.lm_head, tied = untied, tinypy.lm_head
    try:
        draft = load_eagle3_draft(headless, tinypy, torch.float32, "cpu")
    finally:
        tinypy.lm_head = tied
    assert draft.head.weight is table.weight


# ---- DFlash ---------------------------------------------------------------------------------------


def in_dflash_config(key, value):
    return lambda c: c["dflash_config"].__setitem__(key, value)


@pytest.mark.parametrize(
    "edit, message",
    [
        (in_dflash_config("mask_token_id", "x"), r"mask_token_id='x' is invalid"),
        (in_dflash_config("mask_token_id", 2.7), r"mask_token_id=2\.7 is invalid"),
        (in_dflash_config("mask_token_id", True), r"mask_token_id=True is invalid"),
        (in_dflash_config("target_layer_ids", [True, 3, 5]), r"target_layer_ids=\[True, 3, 5\]"),
        (
            lambda c: c.update(block_size=4),
            r"dflash_config\.block_size=8 and the top level's block_size=4",
        ),
        (
            lambda c: c.update(use_sliding_window=True, sliding_window=4, max_window_layers=0),
            "sliding-window DFlash draft layers are not implemented",
        ),
    ],
    ids=["mask-str", "mask-float", "mask-bool", "layer-bool", "block-size-twice", "sliding"],
)
def test_dflash_config_fields_are_refused_by_name(tmp_path, tinypy, edit, message):
    d = broken_copy(tmp_path, "tinypy-dflash", edit)
    with pytest.raises((ConfigError, DraftMismatchError), match=message):
        load_dflash_draft(d, tinypy, torch.float32, "cpu")


# ---- the drafter's draft field (Python API) ---------------------------------------------------------


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(method="ngram", ngram_max=True), "ngram_max=True is invalid"),
        (dict(method="ngram", adaptive="yes"), "adaptive='yes' is invalid"),
        (dict(method="ngram", adaptive=1), "adaptive=1 is invalid"),
        (dict(method="eagle3", draft=5), "draft=5 is invalid: must be a path or None"),
        (dict(method="mtp", token_map=7), "token_map=7 is invalid: must be a path or None"),
    ],
)
def test_speculative_fields_of_the_wrong_type_are_refused(fields, message):
    """They were taken as given (True as 1, 'yes' as adaptive) or failed far from the field."""
    with pytest.raises(ConfigError, match=rf"SpeculativeConfig\.{message}"):
        SpeculativeConfig(**fields)


@pytest.fixture
def target_never_loads(monkeypatch):
    """The draft field is refused before the target (minutes to load at real size) loads."""

    def load_model(*args, **kwargs):
        raise AssertionError("the target loaded before the draft field was checked")

    monkeypatch.setattr("outpace.engine.start_up.load_model", load_model)


@pytest.mark.parametrize("method", ["mtp", "ngram"])
def test_a_draft_for_a_drafter_that_loads_none_is_refused(method, target_never_loads):
    """The CLI refused --draft for these; the API ignored SpeculativeConfig.draft."""
    spec = SpeculativeConfig(method, draft=str(ZOO / "tinypy-eagle3"))
    with pytest.raises(ConfigError, match=rf"draft=.*method '{method}' loads no draft checkpoint"):
        LLM(str(ZOO / "tinypy"), device="cpu", speculative=spec)


def test_a_target_checkpoint_given_as_eagle3_draft_is_named(target_never_loads):
    """It failed deep in the loader on "unexpected tensor 'model.embed_tokens.weight' in model.safetensors"."""
    spec = SpeculativeConfig("eagle3", draft=str(ZOO / "tinypy"))
    with pytest.raises(ConfigError, match=r"draft=.* no fc\.weight tensor.*a target checkpoint\?"):
        LLM(str(ZOO / "tinypy"), device="cpu", speculative=spec)


def test_healthy_drafts_still_serve_losslessly():
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [100, 200, 300]]
    plain = LLM(str(ZOO / "tinypy"), device="cpu", dtype="float32").generate(prompts, params)
    for spec in (
        SpeculativeConfig("eagle3", draft=str(ZOO / "tinypy-eagle3")),
        SpeculativeConfig("dflash", draft=str(ZOO / "tinypy-dflash")),  # num_steps: its block's
    ):
        llm = LLM(str(ZOO / "tinypy"), device="cpu", dtype="float32", speculative=spec)
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
