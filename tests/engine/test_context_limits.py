"""Limits that used to shift or truncate silently are refused with a message naming the setting (issue 42
item 7): a max_model_len the model or the KV cache cannot hold, a max_tokens past the context, a KV cache
too small for the request, token ids that are not integers."""

from __future__ import annotations

from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TINYPY = str(ZOO / "tinypy")
EAGLE3 = SpeculativeConfig("eagle3", draft=str(ZOO / "tinypy-eagle3"), num_steps=5)


@pytest.fixture(scope="module")
def llm():
    return LLM(TINYPY, device="cpu")


def test_a_max_model_len_past_the_model_is_refused_not_clamped():
    with pytest.raises(
        ConfigError,
        match=r"max_model_len=5000 is invalid: the model's max_position_embeddings is "
        r"2048 \(.*tinypy/config.json\)",
    ):
        LLM(TINYPY, device="cpu", max_model_len=5000)


def test_drafts_do_not_shorten_the_context_and_stay_lossless_at_its_end(llm):
    """With a drafter the context is still the model's 2048 tokens (it used to be 2042: the drafts' rows
    were kept inside it); a request that runs into the end of the context verifies drafts past it and
    emits exactly plain decoding's tokens, stopping by length at 2048."""
    spec = LLM(TINYPY, device="cpu", max_model_len=2048, speculative=EAGLE3)
    assert spec.engine.max_model_len == llm.engine.max_model_len == 2048
    prompt = (llm.engine.tokenizer.encode("def fibonacci(n):\n    return n\n") * 200)[:2036]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = llm.generate([prompt], params)[0]
    out = spec.generate([prompt], params)[0]
    assert (
        out.token_ids == expected.token_ids
        and len(out.token_ids) == 12
        and out.finish_reason == "length"
    )


def test_drafts_reaching_past_what_the_rotary_tables_cover_are_refused():
    """A chain's steps are bounded by SpeculativeConfig itself (before a drafter is sized for them); a tree's rows,
    which its drafter counts, by the engine."""
    with pytest.raises(
        ConfigError,
        match=r"SpeculativeConfig.num_steps=100 is invalid: must be an integer in \[1, 63\]",
    ):
        SpeculativeConfig("ngram", num_steps=100)
    with pytest.raises(
        ConfigError,
        match=r"num_steps=5, topk=100, num_draft_tokens=16 is invalid: its drafts reach \d+ "
        r"rows past a request's last token, at most 63 are supported",
    ):
        LLM(
            TINYPY,
            device="cpu",
            speculative=SpeculativeConfig("eagle3", f"{TINYPY}-eagle3", topk=100),
        )


def test_a_tree_whose_topk_reaches_past_the_rotary_tables_is_refused_naming_topk():
    """An EAGLE3 tree's draft steps write (num_steps - 1) * topk rows: with topk 33 they reach past the rows the
    rotary tables cover. The refusal named only num_steps=3 and num_draft_tokens=8, neither of them the cause."""
    tree = SpeculativeConfig(
        "eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3, topk=33, num_draft_tokens=8
    )
    with pytest.raises(
        ConfigError,
        match=r"num_steps=3, topk=33, num_draft_tokens=8 is invalid: its drafts reach 65 rows",
    ):
        LLM(TINYPY, device="cpu", speculative=tree)


def test_max_tokens_past_the_context_is_refused(llm):
    with pytest.raises(
        ValueError, match=r"max_tokens=100000000 is more than the context holds 2048 tokens"
    ):
        llm.generate(["def f(x):"], SamplingParams(max_tokens=100_000_000))
    assert not llm.engine.has_unfinished_requests


def test_a_kv_cache_too_small_for_the_request_is_named_not_truncated():
    """One block of 16 rows, 6 of them kept for EAGLE3's drafts: a 5-token prompt asking for 8 tokens
    used to stop after 5 with finish_reason "length"."""
    llm = LLM(TINYPY, device="cpu", num_kv_blocks=1, speculative=EAGLE3)
    with pytest.raises(
        ValueError,
        match=r"max_tokens=8 does not fit: the prompt has 5 tokens and the context "
        r"holds 10 tokens \(set by the KV cache \(1 blocks of 16\)\); raise "
        r"EngineConfig.num_kv_blocks",
    ):
        llm.generate([[5, 6, 7, 8, 9]], SamplingParams(temperature=0, max_tokens=8))
    out = llm.generate(
        [[5, 6, 7, 8, 9]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 5 and llm.engine.pool.num_free == llm.engine.pool.num_blocks


@pytest.mark.parametrize("bad", [1.0, "5", True, None])
def test_token_ids_must_be_integers(llm, bad):
    with pytest.raises(ValueError, match=r"prompt token id 1 is .* token ids must be integers"):
        llm.generate([[5, bad, 7]], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests


def test_a_drafter_that_drafts_from_a_checkpoint_needs_one():
    """The drafter class says whether it takes a draft checkpoint (no list of methods in the config)."""
    with pytest.raises(
        ConfigError,
        match=r"SpeculativeConfig.draft=None is invalid: method 'eagle3' drafts with a "
        r"draft checkpoint",
    ):
        LLM(TINYPY, device="cpu", speculative=SpeculativeConfig("eagle3", num_steps=3))
