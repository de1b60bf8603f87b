"""The text outpace returns is vLLM's for the same tokens and parameters (vllm/v1/engine/detokenizer.py
``FastIncrementalDetokenizer``: a ``DecodeStream`` primed with the prompt's ids, stepped one output token at a time,
reset when it raises "Invalid prefix encountered"; the final text is that incremental text), fuzzed over random ids
on the zoo's byte-level BPE tokenizer (with added tokens too) and on a SentencePiece-style one built here (``▁``
pieces, byte fallback, with and without the ``Strip`` decoder Llama's has): the streamed text only grows and is
a prefix of the final one (a character split across tokens is never shown as U+FFFD and then corrected), and no
token sequence makes it raise. Then stop strings through the engine: several tokens long, in the prompt only,
overlapping, one a prefix of another, kept or not, and with speculative decoding committing several tokens at once."""

import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from helpers.zoo_drafters import zoo_drafters, zoo_llm
from outpace import SamplingParams
from outpace.detokenizer import DetokenizerState, final_text, update_text

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "tinypy"


def vllm_text(tok, prompt: list[int], out: list[int], skip_special_tokens: bool) -> str:
    """vLLM's FastIncrementalDetokenizer text of ``out`` after ``prompt`` (its ``__init__``, ``decode_next`` and
    ``_protected_step``), written out as the reference: the prompt stepped token by token, as vLLM primed the stream
    before ``DecodeStream(ids=prompt)`` (which, where the prompt ends inside a character, lets the prompt's whole
    text out with the output token that finishes it; outpace does not follow that)."""
    backend, text = tok.backend_tokenizer, ""
    stream = DecodeStream(skip_special_tokens=skip_special_tokens)
    for n, token in enumerate([*prompt, *out]):
        try:
            chunk = stream.step(backend, token)
        except Exception as error:
            assert str(error).startswith("Invalid prefix encountered")
            stream = DecodeStream(skip_special_tokens=skip_special_tokens)
            chunk = stream.step(backend, token)
        text += (chunk or "") if n >= len(prompt) else ""
    return text


def sentencepiece_tokenizer(strip: bool) -> PreTrainedTokenizerFast:
    """Llama 2 / Gemma style: ``▁`` pieces, 256 byte-fallback tokens, special and added tokens."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for piece in [
        "▁",
        "▁a",
        "▁the",
        "▁cat",
        "a",
        "b",
        "é",
        "中",
        "文",
        "▁中",
        "hello",
        "▁hello",
        ",",
    ]:
        vocab[piece] = len(vocab)
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] * strip)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    return tok


def zoo_tokenizer(added: bool):
    tok = AutoTokenizer.from_pretrained(ZOO)
    if added:
        tok.add_tokens([AddedToken("<tool>", special=False, normalized=False), " ünï"])
    return tok


TOKENIZERS = {
    "zoo": lambda: zoo_tokenizer(False),
    "zoo-added": lambda: zoo_tokenizer(True),
    "sentencepiece": lambda: sentencepiece_tokenizer(True),
    "sentencepiece-no-strip": lambda: sentencepiece_tokenizer(False),
}


@pytest.mark.parametrize("name", TOKENIZERS)
def test_random_ids_give_vllms_text(name):
    """Random prompts and outputs (special tokens, added tokens, lone bytes and byte runs that are not UTF-8 often),
    fed in random chunks: every streamed text extends the last, the final text is vLLM's and extends them all."""
    tok = TOKENIZERS[name]()
    rng = random.Random(0)
    specials, vocab = tok.all_special_ids, len(tok)
    added = [i for i in tok.added_tokens_decoder if i not in specials]

    def token() -> int:
        r = rng.random()
        if r < 0.1:
            return rng.choice(specials)
        if r < 0.15 and added:
            return rng.choice(added)
        return rng.randrange(300) if r < 0.6 else rng.randrange(vocab)

    for _ in range(250):
        skip = rng.random() < 0.5
        prompt = [token() for _ in range(rng.randint(1, 8))]
        out = [token() for _ in range(rng.randint(1, 12))]
        state, shown, done = DetokenizerState(), "", 0
        while done < len(out):
            done = min(len(out), done + rng.randint(1, 4))
            text = update_text(tok, out[:done], state, skip, prompt)
            assert text.startswith(shown), (prompt, out, skip)
            shown = text
        final = final_text(tok, out, skip, prompt, state)
        assert final == vllm_text(tok, prompt, out, skip), (prompt, out, skip)
        assert final.startswith(shown)
        assert final_text(tok, out, skip, prompt) == final  # (a fresh state: the same text)
        whole, before = (
            tok.decode(prompt + out, skip_special_tokens=skip),
            tok.decode(prompt, skip_special_tokens=skip),
        )
        if "\ufffd" not in whole and whole.startswith(before):  # (valid text: the decode of it all)
            assert final == whole[len(before) :], (prompt, out, skip)


def test_a_byte_run_that_changes_earlier_text_does_not_fail():
    """Byte fallback decodes a run of byte tokens that is not UTF-8 as one U+FFFD a byte, the valid bytes before
    included, so a later token can change text already emitted: DecodeStream raises "Invalid prefix encountered".
    vLLM (``_protected_step``, vllm-project/vllm#17448) starts a fresh stream; outpace failed the request."""
    tok = sentencepiece_tokenizer(True)
    byte = lambda b: 3 + b  # noqa: E731
    out = [byte(ord("u")), byte(0xD3), byte(0xE3), byte(0xB3), tok.convert_tokens_to_ids("a")]
    with pytest.raises(Exception, match="Invalid prefix"):
        stream = DecodeStream(skip_special_tokens=True)
        for t in out:
            stream.step(tok.backend_tokenizer, t)
    assert final_text(tok, out) == vllm_text(tok, [], out, True) == "ua"


def test_the_first_output_piece_keeps_its_space():
    """vLLM primes the stream with the prompt, so a SentencePiece output's first ``▁`` piece keeps its space (the
    ``Strip`` decoder takes it only at the start of the prompt); a decode of the output alone loses it."""
    tok = sentencepiece_tokenizer(True)
    prompt, out = (
        tok.encode("hello", add_special_tokens=False),
        tok.encode("▁the cat", add_special_tokens=False),
    )
    assert tok.decode(out) == "the cat"
    assert (
        final_text(tok, out, prompt_ids=prompt) == " the cat" == vllm_text(tok, prompt, out, True)
    )


def test_a_character_the_prompt_began_is_finished_by_the_output():
    """The prompt ends inside "é" (its first byte token): the output's second byte finishes it, and vLLM's text
    holds the whole character; nothing is shown while the character is unfinished."""
    tok = zoo_tokenizer(False)
    first, second = tok.encode("é", add_special_tokens=False)
    prompt, out = (
        tok.encode("x = ", add_special_tokens=False) + [first],
        [second, *tok.encode("!", add_special_tokens=False)],
    )
    state = DetokenizerState()
    assert update_text(tok, out[:1], state, prompt_ids=prompt) == "é"
    assert (
        final_text(tok, out, prompt_ids=prompt, state=state)
        == "é!"
        == vllm_text(tok, prompt, out, True)
    )


def test_a_trailing_replacement_character_is_held_back():
    """DecodeStream lets nothing out while the text ends in U+FFFD, unfinished character or not, and vLLM returns
    what it let out: a U+FFFD the output ends on (its three bytes written whole) is not in vLLM's text."""
    tok = zoo_tokenizer(False)
    ids = tok.encode("x\ufffd", add_special_tokens=False)
    assert final_text(tok, ids) == "x" == vllm_text(tok, [], ids, True)
    ids += tok.encode(" y", add_special_tokens=False)  # (once something follows it, it is let out)
    assert final_text(tok, ids) == "x\ufffd y" == vllm_text(tok, [], ids, True)


# ---- stop strings through the engine ---------------------------------------------------------------------------
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def plain_llm():
    return zoo_llm()


@pytest.fixture(scope="module")
def free(plain_llm):
    """The greedy output without stops, and the incremental text after each of its tokens."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    out = plain_llm.generate(PROMPT, params)[0]
    tok, prompt = plain_llm.tokenizer, out.prompt_token_ids
    texts = [vllm_text(tok, prompt, out.token_ids[:k], True) for k in range(len(out.token_ids) + 1)]
    return out, texts


def vllm_stop(texts: list[str], stops: list[str], include: bool, min_tokens: int = 0):
    """vLLM's stop-string rule, one token a step (BaseIncrementalDetokenizer.update and check_stop_strings): after
    token k (k > min_tokens) each stop string in list order is looked for ending in the text that token added; the
    first found cuts the text (at its start, or its end with include_stop_str_in_output). Returns (text, tokens,
    stop) or None."""
    for k in range(min_tokens + 1, len(texts)):
        new = len(texts[k]) - len(texts[k - 1])
        for s in stops:
            at = texts[k].find(s, max(0, len(texts[k]) - new - len(s) + 1)) if new else -1
            if at >= 0:
                return texts[k][: at + len(s) if include else at], k, s
    return None


def stop_cases(text: str, prompt: str) -> list[list[str]]:
    """Stop lists for ``text``: a span of several tokens, a string only the prompt holds, overlapping strings, one
    the prefix of another (both orders)."""
    mid = len(text) // 2
    span = text[mid - 3 : mid + 4]
    in_prompt = next(
        c for c in ["fibonacci(n)", "def fib", "(n):"] if c in prompt and c not in text
    )
    return [
        [span],
        [in_prompt],
        [in_prompt, span],
        [text[mid : mid + 4], text[mid - 2 : mid + 2]],  # overlapping: the earlier-ending one wins
        [text[mid : mid + 2], text[mid : mid + 5]],  # a prefix of another, first
        [text[mid : mid + 5], text[mid : mid + 2]],
    ]


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_cut_where_vllm_cuts(plain_llm, free, include):
    out, texts = free
    for stops in stop_cases(texts[-1], PROMPT):
        params = SamplingParams(
            temperature=0,
            max_tokens=40,
            ignore_eos=True,
            stop=stops,
            include_stop_str_in_output=include,
        )
        got = plain_llm.generate(PROMPT, params)[0]
        want = vllm_stop(texts, stops, include)
        if want is None:
            assert got.text == texts[-1] and got.finish_reason == "length", stops
            continue
        text, k, stop = want
        assert (got.text, got.token_ids, got.stop_reason) == (text, out.token_ids[:k], stop), stops
        assert got.finish_reason == "stop"


@pytest.mark.parametrize("drafter", ["ngram", "eagle3-chain"])
def test_a_stop_inside_a_multi_token_commit(plain_llm, free, drafter):
    """Speculation commits several tokens a step: the text is cut at the first stop even where it ends in the middle
    of a commit, and the token ids end at the token whose text completed it (those of one token a step: vLLM's
    scheduler drops a commit's tokens after a stop token, ``del new_token_ids[num_new:]``; for a stop string vLLM's
    output processor would keep the step's later tokens, which would make the ids depend on the drafter)."""
    out, texts = free
    llm = zoo_llm(zoo_drafters(chain_steps=4, tree=(3, 2, 6))[drafter])
    for stops in stop_cases(texts[-1], PROMPT)[:4]:
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stops)
        plain, spec = plain_llm.generate(PROMPT, params)[0], llm.generate(PROMPT, params)[0]
        assert (spec.text, spec.token_ids, spec.stop_reason) == (
            plain.text,
            plain.token_ids,
            plain.stop_reason,
        )


def test_min_tokens_delays_stop_strings(plain_llm, free):
    out, texts = free
    stop = texts[-1][len(texts[-1]) // 2 : len(texts[-1]) // 2 + 2]
    for min_tokens in (0, 3, 10):
        params = SamplingParams(
            temperature=0, max_tokens=40, ignore_eos=True, stop=[stop], min_tokens=min_tokens
        )
        got = plain_llm.generate(PROMPT, params)[0]
        want = vllm_stop(texts, [stop], False, min_tokens)
        assert want is not None and (got.text, got.token_ids) == (want[0], out.token_ids[: want[1]])
