"""vLLM's ``min_tokens``, ``include_stop_str_in_output``, ``skip_special_tokens`` and ``allowed_token_ids``: no
end-of-sequence id nor stop token id is sampled among a request's first min_tokens output tokens (the prompt's
first token included: the prefill samples it), the same with and without speculation, for every drafter; a stop string
counts only where it ends past the text of those tokens, and stays in the text when asked; special tokens are
decoded when asked, whole or incrementally; only allowed tokens are sampled, with and without speculation."""

import pytest

from helpers.zoo_drafters import zoo_drafters, zoo_llm
from outpace import LLM, SamplingParams
from outpace.engine.engine import LLMEngine
from outpace.sampling_params import StructuredOutputsParams
from outpace.validation import ConfigError

DRAFTERS = zoo_drafters(chain_steps=4, tree=(3, 2, 6))
PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def push(self, x):\n",
    "import os\n\nfor name in ",
]
EOS = 0  # zoo/tinypy's eos_token_id


@pytest.fixture(scope="module")
def plain_llm() -> LLM:
    return zoo_llm()


@pytest.fixture(scope="module")
def unbounded(plain_llm) -> list[list[int]]:
    """Each prompt's greedy output without stops."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return [o.token_ids for o in plain_llm.generate(PROMPTS, params)]


def _params(unbounded: list[list[int]], min_tokens: int) -> list[SamplingParams]:
    """Per prompt: its greedy output's second token as a stop token, and the end-of-sequence id pushed to the top
    by a bias (without min_tokens the output would end at once)."""
    return [
        SamplingParams(
            temperature=0,
            max_tokens=24,
            min_tokens=min_tokens,
            stop_token_ids=(out[1],),
            logit_bias={EOS: 60.0},
        )
        for out in unbounded
    ]


def test_stop_ids_are_banned_until_min_tokens(plain_llm, unbounded):
    ended = plain_llm.generate(PROMPTS, _params(unbounded, 0))
    assert all(o.token_ids == [EOS] for o in ended)  # the prefill's token: end of sequence
    one = plain_llm.generate(PROMPTS, _params(unbounded, 1))  # the prefill's token is banned
    assert all(len(o.token_ids) == 2 and o.token_ids[1] == EOS for o in one)
    outs = plain_llm.generate(PROMPTS, _params(unbounded, 6))
    for o, free in zip(outs, unbounded):
        # six tokens, neither the end of sequence nor the stop id, then the end of sequence the bias favours
        assert len(o.token_ids) == 7 and o.token_ids[6] == EOS, o.token_ids
        assert EOS not in o.token_ids[:6] and free[1] not in o.token_ids[:6]
        assert o.finish_reason == "stop" and o.stop_reason is None
    assert not plain_llm.engine.has_unfinished_requests


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_min_tokens_output_equal_with_and_without_speculation(plain_llm, unbounded, drafter):
    """A weaker bias: the end of sequence competes with the other tokens once min_tokens allows it."""
    params = [p.replace(logit_bias={EOS: 12.0}) for p in _params(unbounded, 9)]
    want = [o.token_ids for o in plain_llm.generate(PROMPTS, params)]
    assert all(len(t) > 9 for t in want)
    outs = zoo_llm(DRAFTERS[drafter]).generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == want


def test_min_tokens_changes_a_steps_kind_only_while_it_holds():
    """A request with min_tokens (and no other logits processing) makes its batch's steps process the logits only
    until its output holds them; its tokens are those it gets without min_tokens where no stop id came early."""
    llm = zoo_llm()
    run, penalized = llm.engine.runner.decode_step.run, []
    llm.engine.runner.decode_step.run = lambda key, *a: (
        penalized.append(key.features.penalties) or run(key, *a)
    )
    free = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in llm.generate(PROMPTS, free)]
    penalized.clear()
    outs = llm.generate(PROMPTS, free.replace(ignore_eos=False, min_tokens=4))
    assert [o.token_ids for o in outs] == [t[: len(o.token_ids)] for t, o in zip(want, outs)]
    assert all(len(o.token_ids) > 4 for o in outs)
    # the prefill samples output token 1: the steps sampling tokens 2 to 4 hold min_tokens, none after the fifth
    # token's does (that one may: a step run ahead takes its kind before the step before it is read)
    assert penalized[:3] == [True] * 3 and not any(penalized[4:]), penalized


def test_stop_strings_count_past_min_tokens_and_may_stay_in_the_text(plain_llm):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    out = plain_llm.generate(PROMPTS[0], params)[0]
    text, decode = out.text, plain_llm.tokenizer.decode
    prefixes = [decode(out.token_ids[:k]) for k in range(len(out.token_ids) + 1)]

    def first_tokens(c: str) -> int:  # the output tokens whose text first holds c
        return next(k for k, t in enumerate(prefixes) if c in t)

    # a character that the output's first third holds, and again past the tokens that first hold it
    stop = next(
        c
        for c in text[: len(text) // 3]
        if c.strip() and text.find(c, len(prefixes[first_tokens(c)])) >= 0
    )
    cut = plain_llm.generate(PROMPTS[0], params.replace(stop=(stop,)))[0]
    assert cut.text == text[: text.index(stop)] and cut.stop_reason == stop
    kept = plain_llm.generate(
        PROMPTS[0], params.replace(stop=(stop,), include_stop_str_in_output=True)
    )[0]
    assert kept.text == text[: text.index(stop) + 1]
    k = first_tokens(stop)
    late = plain_llm.generate(PROMPTS[0], params.replace(stop=(stop,), min_tokens=k))[0]
    assert late.text == text[: text.index(stop, len(prefixes[k]))]
    assert late.finish_reason == "stop" and late.stop_reason == stop


def test_stop_strings_are_searched_in_the_new_text_alone(plain_llm, monkeypatch):
    """Each token's search starts a stop string's length before the new characters (vLLM's check_stop_strings), so
    a long output does not search its whole text again per token; a stop string spanning tokens is still found."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    text = plain_llm.generate(PROMPTS[0], params)[0].text
    starts: list[
        tuple[int, int]
    ] = []  # per search: (where it starts, the text's length before the token)
    seen: dict[str, int] = {}
    append = LLMEngine._append_token

    def spy(engine, req, token):
        before = len(req.text)
        stop = append(engine, req, token)
        if req.params.stop and len(req.output_token_ids) > req.params.min_tokens:
            starts.append((seen.get(req.request_id, 0), before))
        seen[req.request_id] = req.stop_search_from
        return stop

    monkeypatch.setattr(LLMEngine, "_append_token", spy)
    absent = "\x00never"
    assert plain_llm.generate(PROMPTS[0], params.replace(stop=(absent,)))[0].text == text
    assert len(starts) == 24 and all(start == before for start, before in starts[1:])
    spanning = text[
        len(text) // 2 - 3 : len(text) // 2 + 3
    ]  # (six characters: most likely two tokens or more)
    cut = plain_llm.generate(PROMPTS[0], params.replace(stop=(spanning,)))[0]
    assert cut.text == text[: text.index(spanning)] and cut.stop_reason == spanning


@pytest.mark.parametrize("drafter", ["eagle3-tree", "ngram"])
def test_only_allowed_tokens_are_sampled(plain_llm, unbounded, drafter):
    """Each request allowed a few tokens of its free output and two it would not choose (one biased up; a token
    outside them biased far up): every token is one of them, the output differs from the free one, and speculation
    does not change it."""
    params = [
        SamplingParams(
            temperature=t,
            seed=7,
            max_tokens=16,
            ignore_eos=True,
            allowed_token_ids=(*free[2:5], 4000, 4001),
            logit_bias={4001: 3.0, 4002: 50.0},  # 4002 not allowed: its bias does not let it in
        )
        for free, t in zip(unbounded, (0, 0, 0.8))
    ]
    want = [o.token_ids for o in plain_llm.generate(PROMPTS, params)]
    for tokens, p, free in zip(want, params, unbounded):
        assert set(tokens) <= set(p.allowed_token_ids) and tokens != free[:16]
    assert [o.token_ids for o in zoo_llm(DRAFTERS[drafter]).generate(PROMPTS, params)] == want


def test_bad_min_tokens_is_refused_by_name(plain_llm):
    with pytest.raises(ConfigError, match=r"SamplingParams.min_tokens=9 is invalid"):
        SamplingParams(max_tokens=8, min_tokens=9)
    with pytest.raises(ConfigError, match=r"SamplingParams.min_tokens=-1 is invalid"):
        SamplingParams(min_tokens=-1)
    with pytest.raises(
        ConfigError, match=r"SamplingParams.min_tokens=2 is invalid: must be 0 with"
    ):
        SamplingParams(min_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(ValueError, match=r"stop_token_ids token ids \[9999\] are outside"):
        plain_llm.generate("x", SamplingParams(min_tokens=1, stop_token_ids=(9999,)))
    with pytest.raises(ValueError, match=r"allowed_token_ids token ids \[9999\] are outside"):
        plain_llm.generate("x", SamplingParams(allowed_token_ids=(3, 9999)))
    with pytest.raises(ValueError, match=r"min_tokens=2 leaves no token to sample"):
        plain_llm.generate(
            "x", SamplingParams(min_tokens=2, allowed_token_ids=(EOS, 7), stop_token_ids=(7,))
        )
    with pytest.raises(ConfigError, match=r"SamplingParams.allowed_token_ids=\(\) is invalid"):
        SamplingParams(allowed_token_ids=())
    assert not plain_llm.engine.has_unfinished_requests


def test_special_tokens_are_decoded_when_asked(plain_llm):
    assistant = 5  # zoo/tinypy's <|assistant|>, a special token, pushed into the output by a bias
    params = SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, logit_bias={assistant: 60.0}
    )
    skipped = plain_llm.generate(PROMPTS[0], params)[0]
    assert skipped.token_ids == [assistant] * 6 and skipped.text == ""
    shown = plain_llm.generate(PROMPTS[0], params.replace(skip_special_tokens=False))[0]
    assert shown.text == "<|assistant|>" * 6
    # decoded step by step (stop strings are checked in the text as it grows): the special tokens are there
    two = "<|assistant|>" * 2
    stopped = plain_llm.generate(
        PROMPTS[0],
        params.replace(skip_special_tokens=False, stop=(two,), include_stop_str_in_output=True),
    )[0]
    assert stopped.text == two and stopped.stop_reason == two


def test_the_stopping_token_stays_out_of_the_text(plain_llm):
    """A request that ends on its EOS or a stop token id keeps the token in its ids but not in its text, unless
    include_stop_str_in_output (vLLM's detokenizer), so that with special tokens shown no answer ends in
    "<|endoftext|>"."""
    params = SamplingParams(
        temperature=0, max_tokens=6, skip_special_tokens=False, logit_bias={EOS: 60.0}
    )
    ended = plain_llm.generate(PROMPTS[0], params)[0]
    assert ended.token_ids == [EOS] and ended.finish_reason == "stop" and ended.text == ""
    kept = plain_llm.generate(PROMPTS[0], params.replace(include_stop_str_in_output=True))[0]
    assert kept.text == plain_llm.tokenizer.decode([EOS])
    assistant = 5  # (a special token as a stop token id)
    params = params.replace(logit_bias={assistant: 60.0}, stop_token_ids=(assistant,))
    stopped = plain_llm.generate(PROMPTS[0], params)[0]
    assert stopped.token_ids == [assistant] and stopped.stop_reason == assistant
    assert stopped.text == ""
