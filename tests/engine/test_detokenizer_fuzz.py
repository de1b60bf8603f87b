"""The text outpace returns is vLLM's for the same tokens and parameters (vllm/v1/engine/detokenizer.py
``FastIncrementalDetokenizer``: a ``DecodeStream`` primed with the prompt's ids, stepped one output token at a time,
reset when it raises "Invalid prefix encountered"; the final text is that incremental text), fuzzed over random ids
on the zoo's byte-level BPE tokenizer (with added tokens too) and on a SentencePiece-style one built here (``▁``
pieces, byte fallback, with and without the ``Strip`` decoder Llama's has): the streamed text only grows and is
a prefix of the final one (a character split across tokens is never shown as U+FFFD and then corrected), and no
token sequence makes it raise; the same for tokenizers that clean up spaces after decoding (BERT's WordPiece, a
byte-level BPE), which vLLM steps through a DecodeStream all the same. Tokenizers without a Rust backend (Python,
"slow" ones: transformers' BERT and ByT5, a byte-level BPE and a SentencePiece-style one written here) against vLLM's
``SlowIncrementalDetokenizer`` (vllm/tokenizers/detokenizer_utils.py ``detokenize_incrementally``) after every
chunk of tokens. Then stop strings through the engine: several tokens long, in the prompt only,
overlapping, one a prefix of another, kept or not, and with speculative decoding committing several tokens at once."""

import json
import random
import re
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer, PreTrainedTokenizer, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

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


def zoo_tokenizer(added: bool, clean_up: bool = False):
    # (transformers 5 leaves a BPE tokenizer's spaces alone unless told it may "corrupt" its output)
    force = dict(clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=clean_up)
    tok = AutoTokenizer.from_pretrained(ZOO, clean_up_tokenization_spaces=clean_up, **force)
    if added:
        tok.add_tokens([AddedToken("<tool>", special=False, normalized=False), " ünï"])
    return tok


TOKENIZERS = {
    "zoo": lambda: zoo_tokenizer(False),
    "zoo-added": lambda: zoo_tokenizer(True),
    "sentencepiece": lambda: sentencepiece_tokenizer(True),
    "sentencepiece-no-strip": lambda: sentencepiece_tokenizer(False),
    # clean_up_tokenization_spaces: tokenizer.decode cleans up spaces, but vLLM steps a DecodeStream all the same
    "zoo-clean-up": lambda: zoo_tokenizer(True, clean_up=True),
    "bert-clean-up": lambda: bert_fast(),
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
            assert text == vllm_text(tok, prompt, out[:done], skip), (prompt, out[:done], skip)
            shown = text
        final = final_text(tok, out, skip, prompt, state)
        assert final == vllm_text(tok, prompt, out, skip), (prompt, out, skip)
        assert final.startswith(shown)
        assert final_text(tok, out, skip, prompt) == final  # (a fresh state: the same text)
        whole, before = (
            tok.decode(prompt + out, skip_special_tokens=skip),
            tok.decode(prompt, skip_special_tokens=skip),
        )
        valid = "\ufffd" not in whole and whole.startswith(before)
        if valid and not tok.clean_up_tokenization_spaces:  # (valid text: the decode of it all)
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


# ---- tokenizers vLLM detokenizes in Python ---------------------------------------------------------------------
def vllm_slow_texts(tok, prompt: list[int], out: list[int], skip_special_tokens: bool) -> list[str]:
    """vLLM's SlowIncrementalDetokenizer text after each token of ``out`` (vllm/v1/engine/detokenizer.py, the path
    of a tokenizer that is not a ``PreTrainedTokenizerFast``), written out as the reference. Its ``__init__`` keeps
    the strings of the prompt's last 7 tokens (``convert_prompt_ids_to_tokens``: offset 5, plus 2), the window
    starting 5 before its end; each token goes through ``detokenize_incrementally``
    (vllm/tokenizers/detokenizer_utils.py): its string (an id past ``len(tok)`` is ""; a special token skipped is no
    string at all) is appended, and the text of the window with it, less that of the window without it, is let out
    unless it is not longer or ends in U+FFFD. A window with added tokens is joined as
    ``_convert_tokens_to_string_with_added_encoders`` does, with ``spaces_between_special_tokens`` (vLLM's
    default, the only value outpace takes): each added token alone, the runs between through
    ``convert_tokens_to_string``, all joined by spaces. The final text is the last of these."""

    def string(tokens: list[str]) -> str:
        if tok.is_fast or not tok.get_added_vocab():
            return tok.convert_tokens_to_string(tokens)
        added = set(tok.get_added_vocab())
        skipped = set(tok.all_special_tokens) if skip_special_tokens else set()
        parts, run = [], []
        for t in tokens:
            if t in skipped:
                continue
            if t in added:
                parts += [tok.convert_tokens_to_string(run)] * bool(run) + [t]
                run = []
            else:
                run.append(t)
        return " ".join(parts + [tok.convert_tokens_to_string(run)] * bool(run))

    strings = tok.convert_ids_to_tokens(prompt[-7:], skip_special_tokens=skip_special_tokens)
    tokens = [t or "" for t in strings]
    read = len(tokens)
    prefix, text, texts = max(read - 5, 0), "", []
    for token in out:
        if 0 <= token < len(tok):
            strings = tok.convert_ids_to_tokens([token], skip_special_tokens=skip_special_tokens)
            tokens += [t or "" for t in strings]
        else:
            tokens.append("")
        seen, now = string(tokens[prefix:read]), string(tokens[prefix:])
        if len(now) > len(seen) and not now.endswith("\ufffd"):
            text += now[len(seen) :]
            prefix, read = read, len(tokens)
        texts.append(text)
    return texts


WORDPIECE = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] a b c d e é s t ' . , ? ! ( ) 中 文 ##a ##b ##é ##中".split()
)
WORDPIECE += "play ##ing ##ed the cat do not n ##t s m ve re hello".split()


def wordpiece_vocab(tmp_path: Path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(WORDPIECE) + "\n")
    return path


def add_tokens(tok):
    """A special token beyond the tokenizer's own, and an added token that is not special."""
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    return tok


def bert_fast() -> PreTrainedTokenizerFast:
    """BERT's: WordPiece with ``##`` continuations, its decoder cleaning up spaces, clean_up_tokenization_spaces."""
    backend = Tokenizer(
        models.WordPiece({t: i for i, t in enumerate(WORDPIECE)}, unk_token="[UNK]")
    )
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    special = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, mask_token="[MASK]", clean_up_tokenization_spaces=True, **special
    )
    return add_tokens(tok)


def bert_slow(tmp_path: Path):
    """transformers' Python BERT tokenizer (``BertTokenizerLegacy``) on the same vocabulary."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    tok = BertTokenizerLegacy(str(wordpiece_vocab(tmp_path)), clean_up_tokenization_spaces=True)
    assert not tok.is_fast and tok.clean_up_tokenization_spaces
    return add_tokens(tok)


class SlowByteLevel(PreTrainedTokenizer):
    """A Python byte-level BPE tokenizer (GPT-2's slow one, reduced to what decoding needs) on the zoo's vocabulary:
    a token's string is its bytes in GPT-2's byte alphabet, and the bytes of a run of them decode with
    ``errors="replace"`` (a character split across tokens is U+FFFD until it is finished)."""

    def __init__(self, **kwargs):
        vocab = json.loads((ZOO / "tokenizer.json").read_text())["model"]["vocab"]
        self.encoder, self.decoder = vocab, {i: t for t, i in vocab.items()}
        super().__init__(eos_token="<|endoftext|>", **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder, **self.added_tokens_encoder)

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        byte = {c: b for b, c in bytes_to_unicode().items()}
        return bytes(byte[c] for c in "".join(tokens)).decode("utf-8", errors="replace")


class SlowSentencePiece(PreTrainedTokenizer):
    """A Python SentencePiece-style tokenizer (Llama 2's slow one, reduced): ``▁`` pieces and ``<0xNN>`` byte
    fallback; a run of pieces decodes to its bytes (``errors="replace"``) with the leading space of the first taken
    off, so a piece's text depends on what is before it."""

    PIECES = ["▁", "▁a", "▁the", "▁cat", "a", "b", "é", "中", "▁中", "hello", "▁hello", ",", "."]

    def __init__(self, **kwargs):
        vocab = [f"<0x{b:02X}>" for b in range(256)] + self.PIECES
        self.encoder = {"<unk>": 0, "<s>": 1, "</s>": 2} | {t: 3 + i for i, t in enumerate(vocab)}
        self.decoder = {i: t for t, i in self.encoder.items()}
        special = dict(unk_token="<unk>", bos_token="<s>", eos_token="</s>")
        super().__init__(clean_up_tokenization_spaces=True, **special, **kwargs)

    vocab_size = property(lambda self: len(self.encoder))
    get_vocab = SlowByteLevel.get_vocab
    _convert_token_to_id = SlowByteLevel._convert_token_to_id
    _convert_id_to_token = SlowByteLevel._convert_id_to_token

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = b"".join(
            bytes([int(t[3:5], 16)]) if _BYTE.fullmatch(t) else t.replace("▁", " ").encode()
            for t in tokens
        )
        text = data.decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


_BYTE = re.compile(r"<0x[0-9A-F]{2}>")


def byt5(tmp_path: Path):
    """transformers' ByT5 tokenizer: one token a byte, bytes decoded with ``errors="ignore"``."""
    from transformers.models.byt5.tokenization_byt5 import ByT5Tokenizer

    return ByT5Tokenizer()


PYTHON_TOKENIZERS = {
    "bert-python": bert_slow,
    "byte-level-python": lambda tmp_path: add_tokens(
        SlowByteLevel(clean_up_tokenization_spaces=True)
    ),
    "sentencepiece-python": lambda tmp_path: add_tokens(SlowSentencePiece()),
    "byt5": byt5,
}


def byte_tokens(tok, name: str) -> list[int] | None:
    """The ids of the 256 byte tokens of the tokenizer (None: it has none, BERT's)."""
    if name == "byt5":
        return [3 + b for b in range(256)]
    if name == "sentencepiece-python":
        return tok.convert_tokens_to_ids([f"<0x{b:02X}>" for b in range(256)])
    if name == "byte-level-python":
        return tok.convert_tokens_to_ids(list(bytes_to_unicode().values()))
    return None


@pytest.mark.parametrize("name", PYTHON_TOKENIZERS)
def test_python_tokenizers_give_vllms_text(name, tmp_path):
    """Random prompts and outputs through a tokenizer without a Rust backend, fed in random chunks (as speculative
    decoding commits them): after every chunk the text is vLLM's (SlowIncrementalDetokenizer) after the same tokens,
    and the final text is vLLM's, so the streamed deltas add up to it and nothing beyond it is ever shown. Special
    and added tokens, ids past the vocabulary, characters split across byte tokens (cut short too, or their bytes
    out of order), skip_special_tokens on and off."""
    tok = PYTHON_TOKENIZERS[name](tmp_path)
    rng = random.Random(0)
    specials, vocab, bytes_ = tok.all_special_ids, len(tok), byte_tokens(tok, name)
    added = [i for i in tok.added_tokens_decoder if i not in specials]
    chars = [c.encode() for c in "é中🐍→ü"]

    def tokens(output: bool = True) -> list[int]:
        r = rng.random()
        if r < 0.1:
            return [rng.choice(specials)]
        if r < 0.15 and added:
            return [rng.choice(added)]
        if r < 0.17 and output and name != "byt5":  # (ByT5 fails on the "" vLLM gives such an id)
            return [vocab + rng.randrange(3)]
        if r < 0.4 and bytes_:
            data = bytearray(rng.choice(chars)[: rng.randint(1, 4)])
            if rng.random() < 0.2:
                rng.shuffle(data)
            return [bytes_[b] for b in data]
        return [rng.randrange(vocab)]

    for _ in range(200):
        skip = rng.random() < 0.5
        prompt = [t for _ in range(rng.randint(0, 9)) for t in tokens(output=False)]
        out = [t for _ in range(rng.randint(1, 10)) for t in tokens()]
        texts = vllm_slow_texts(tok, prompt, out, skip)
        state, deltas, done = DetokenizerState(), [], 0
        while done < len(out):
            done = min(len(out), done + rng.randint(1, 4))
            text = update_text(tok, out[:done], state, skip, prompt)
            assert text == texts[done - 1], (prompt, out[:done], skip)
            deltas.append(text[len("".join(deltas)) :])
        final = final_text(tok, out, skip, prompt, state)
        assert final == texts[-1] == "".join(deltas), (prompt, out, skip)
        assert final_text(tok, out, skip, prompt) == final  # (a fresh state: the same text)


def test_a_fast_tokenizer_that_cleans_up_spaces_is_stepped_as_vllm_steps_it():
    """vLLM steps a DecodeStream for every ``PreTrainedTokenizerFast``, ``clean_up_tokenization_spaces`` or not: the
    output decodes in the prompt's context (a WordPiece ``##`` continuation joins the prompt's last word) and a BPE's
    spaces are not cleaned up. outpace decoded such a tokenizer's output alone through ``tokenizer.decode``
    ("##ing the cat.", "x = a. b")."""
    tok = bert_fast()
    prompt, out = (
        tok.encode("play", add_special_tokens=False),
        tok.convert_tokens_to_ids(["##ing", "the", "cat", "."]),
    )
    assert (
        final_text(tok, out, prompt_ids=prompt)
        == "ing the cat."
        == vllm_text(tok, prompt, out, True)
    )
    tok = zoo_tokenizer(False, clean_up=True)
    out = tok.encode("x = a . b", add_special_tokens=False)
    assert tok.decode(out) == "x = a. b"
    assert final_text(tok, out) == "x = a . b" == vllm_text(tok, [], out, True)


@pytest.mark.parametrize("skip", [True, False])
def test_a_python_tokenizer_is_detokenized_as_vllm_does(tmp_path, skip):
    """transformers' Python BERT tokenizer: the first output token decodes in the prompt's last tokens (``##ing``
    after "play"), spaces are not cleaned up (vLLM decodes with ``convert_tokens_to_string``, never
    ``tokenizer.decode``), and an added token stands apart, joined by spaces. outpace decoded the output alone
    with ``tokenizer.decode``: "##ing the cat. <tool> a"."""
    tok = bert_slow(tmp_path)
    prompt = tok.encode("play", add_special_tokens=False)
    out = tok.convert_tokens_to_ids(["##ing", "the", "cat", ".", "<tool>", "a", "[SEP]"])
    want = "ing the cat . <tool> a" + " [SEP]" * (not skip)
    assert final_text(tok, out, skip, prompt) == want == vllm_slow_texts(tok, prompt, out, skip)[-1]
    # (the prompt's last 7 tokens are kept, then special ones skipped: the word before five of them still counts)
    prompt = tok.convert_tokens_to_ids(["cat", "[SEP]", "[CLS]", "[PAD]", "[PAD]", "[MASK]"])
    out = tok.convert_tokens_to_ids(["."])
    assert final_text(tok, out, skip, prompt) == " ." == vllm_slow_texts(tok, prompt, out, skip)[-1]


def test_a_python_sentencepiece_tokenizer_keeps_the_first_pieces_space():
    """The first output piece keeps its space in the prompt's context, and a character the output's last byte
    tokens leave unfinished is never let out."""
    tok = SlowSentencePiece()
    prompt = tok.convert_tokens_to_ids(["▁hello"])
    out = tok.convert_tokens_to_ids(["▁the", "▁cat", "<0xC3>", "<0xA9>", "<0xC3>"])
    assert tok.decode(out) == "the caté\ufffd"
    state = DetokenizerState()
    assert update_text(tok, out[:3], state, prompt_ids=prompt) == " the cat"
    assert final_text(tok, out, prompt_ids=prompt, state=state) == " the caté"
    assert vllm_slow_texts(tok, prompt, out, True) == [
        " the",
        " the cat",
        " the cat",
        *[" the caté"] * 2,
    ]


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
