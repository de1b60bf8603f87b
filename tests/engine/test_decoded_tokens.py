"""LLM.generate fills ``Logprob.decoded_token`` as vLLM's does: every entry (the chosen token and the top
alternatives, of the output and of the prompt) holds ``tokenizer.decode([token_id])``, when log-probabilities
were asked for."""

import pytest

from helpers.zoo_drafters import zoo_llm
from outpace import SamplingParams

PROMPTS = ["def fibonacci(n):\n", "import os\n\nfor name in "]


@pytest.fixture(scope="module")
def llm():
    return zoo_llm()


def entries(out):
    """Every position's entry of ``out``: the prompt's (less the first, which has none), then each
    completion's."""
    yield from out.prompt_logprobs[1:]
    for completion in out.outputs:
        yield from completion.logprobs


def test_every_logprob_holds_its_tokens_text(llm):
    params = SamplingParams(
        temperature=0.8, seed=3, n=2, max_tokens=10, logprobs=3, prompt_logprobs=2
    )
    outs = llm.generate(PROMPTS, params)
    seen = 0
    for out in outs:
        for entry in entries(out):
            for token_id, logprob in entry.items():
                assert logprob.decoded_token == llm.tokenizer.decode([token_id]), token_id
                seen += 1
    assert seen > 2 * (10 + 4) * 3  # chosen and top tokens of every position were checked


def test_decoded_tokens_are_the_tokens_text_not_the_vocabulary_piece(llm):
    """A byte-level BPE piece (``Ġfor``, ``Ċ``) is not what vLLM shows: its text is (`` for``, a newline)."""
    out = llm.generate("x = 1\nfor i in", SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    texts = [next(iter(e.values())).decoded_token for e in out.prompt_logprobs[1:]]
    assert "".join(texts) == llm.tokenizer.decode(out.prompt_token_ids[1:])
    pieces = llm.tokenizer.convert_ids_to_tokens(out.prompt_token_ids[1:])
    assert texts != pieces


def test_each_distinct_token_is_decoded_once_and_only_when_asked(llm, monkeypatch):
    calls = []
    decode = llm.tokenizer.decode

    def counting(ids, *args, **kwargs):
        if len(ids) == 1:
            calls.append(ids[0])
        return decode(ids, *args, **kwargs)

    monkeypatch.setattr(llm.tokenizer, "decode", counting)
    llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    assert calls == []  # no logprobs: nothing decoded token by token
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=5))
    assert sorted(calls) == sorted({t for o in outs for e in o.logprobs for t in e})
