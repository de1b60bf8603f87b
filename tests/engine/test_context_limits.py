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
    with pytest.raises(ConfigError, match=r"max_model_len=5000 is invalid: the model's max_position_embeddings is "
                                          r"2048 \(.*tinypy/config.json\)"):
        LLM(TINYPY, device="cpu", max_model_len=5000)


def test_a_max_model_len_the_drafts_rows_leave_no_room_for_is_refused():
    with pytest.raises(ConfigError, match=r"max_model_len=2048 is invalid: the context holds 2042 tokens, set by "
                                          r"max_position_embeddings \(6 rows are kept for the drafts\)"):
        LLM(TINYPY, device="cpu", max_model_len=2048, speculative=EAGLE3)


def test_max_tokens_past_the_context_is_refused(llm):
    with pytest.raises(ValueError, match=r"max_tokens=100000000 is more than the context holds 2048 tokens"):
        llm.generate(["def f(x):"], SamplingParams(max_tokens=100_000_000))
    assert not llm.engine.has_unfinished_requests


def test_a_kv_cache_too_small_for_the_request_is_named_not_truncated():
    """One block of 16 rows, 6 of them kept for EAGLE3's drafts: a 5-token prompt asking for 8 tokens
    used to stop after 5 with finish_reason "length"."""
    llm = LLM(TINYPY, device="cpu", num_kv_blocks=1, speculative=EAGLE3)
    with pytest.raises(ValueError, match=r"max_tokens=8 does not fit: the prompt has 5 tokens and the context "
                                         r"holds 10 tokens \(set by the KV cache \(1 blocks of 16\)\); raise "
                                         r"EngineConfig.num_kv_blocks"):
        llm.generate([[5, 6, 7, 8, 9]], SamplingParams(temperature=0, max_tokens=8))
    out = llm.generate([[5, 6, 7, 8, 9]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and llm.engine.pool.num_free == llm.engine.pool.num_blocks


@pytest.mark.parametrize("bad", [1.0, "5", True, None])
def test_token_ids_must_be_integers(llm, bad):
    with pytest.raises(ValueError, match=r"prompt token id 1 is .* token ids must be integers"):
        llm.generate([[5, bad, 7]], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests
