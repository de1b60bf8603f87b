"""The final text of a finished output (detokenizer.py ``final_text``): a character its last tokens began and did
not finish (max_tokens or a stop cut it after its first byte tokens) is left out, as vLLM's incremental
detokenizer never emits it, instead of ending the text in U+FFFD; a U+FFFD the model wrote whole stays inside the
text. On the zoo's byte-level BPE tokenizer, and on a byte-fallback one (SentencePiece's ``<0xNN>`` tokens)."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from outpace.detokenizer import final_text

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "tinypy"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ZOO)


@pytest.mark.parametrize("text", ["é", "a é", "中文", "🐍 x", "→ 世界 🐍 é"])
def test_a_cut_character_is_left_out(tok, text):
    """Every cut of the text's tokens: the text of the whole characters before the cut, which is the decode of the
    longest prefix of the tokens that does not end in U+FFFD (the zoo writes a non-ASCII character byte by byte)."""
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # (characters of several byte tokens)
    whole = ""
    for n in range(len(ids) + 1):
        decoded = tok.decode(ids[:n])
        if not decoded.endswith("\ufffd"):
            whole = decoded
        assert final_text(tok, ids[:n]) == whole, n
    assert whole == text


def test_a_replacement_character_written_whole_stays(tok):
    """Inside the text it stays; at its end it is held back like an unfinished character, as vLLM's DecodeStream
    holds any text that ends in U+FFFD (test_detokenizer_fuzz.py ``test_a_trailing_replacement_character_is_held_back``)."""
    ids = tok.encode("x\ufffd", add_special_tokens=False)  # (its three bytes, a whole character)
    assert final_text(tok, ids) == "x"
    assert final_text(tok, ids + tok.encode("y", add_special_tokens=False)) == "x\ufffdy"
    assert final_text(tok, ids[:-1]) == "x"  # cut inside it: left out like any other
    cut = tok.encode("é", add_special_tokens=False)[:1]
    assert tok.decode(ids + cut) == "x\ufffd\ufffd" and final_text(tok, ids + cut) == "x"


def test_skipped_special_tokens_after_the_cut(tok):
    """A special token after the cut is left out with it where special tokens are skipped; shown, it ends the text
    (which then does not end in the cut character)."""
    cut = tok.encode("aé", add_special_tokens=False)[:-1]
    eos = tok.eos_token_id
    assert final_text(tok, [*cut, eos]) == "a"
    shown = final_text(tok, [*cut, eos], skip_special_tokens=False)
    assert shown == tok.decode([*cut, eos], skip_special_tokens=False) == "a\ufffd" + tok.eos_token


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """Pieces and byte tokens, decoded as SentencePiece's byte fallback does (Llama 2's, Gemma's)."""
    vocab = {"<unk>": 0, "▁a": 1, "<0xC3>": 2, "<0xA9>": 3, "<0xE4>": 4, "<0xB8>": 5, "<0xAD>": 6}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def test_byte_fallback():
    """Its decoder turns a run of byte tokens that is not whole UTF-8 into one U+FFFD a byte, the whole characters
    before the cut with them; left out, the cut gives those characters back."""
    tok = byte_fallback_tokenizer()
    a, c3, a9, e4, b8, ad = range(1, 7)
    assert tok.decode([a, e4, b8, ad, c3]) == "a\ufffd\ufffd\ufffd\ufffd"
    assert final_text(tok, [a, e4, b8, ad, c3]) == "a中"
    assert final_text(tok, [a, e4, b8]) == "a" and final_text(tok, [a, c3, a9]) == "aé"
    assert (
        final_text(tok, [a, a9]) == "a"
    )  # (a byte no character begins with: held back too, as vLLM does)


def test_tokens_of_unknown_bytes_are_left_as_decoded():
    """A decoder that is neither byte-level nor byte fallback: its tokens' text is taken as whole characters."""
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "\ufffd": 1, "b": 2}, unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert final_text(tok, [2, 1, 2]) == tok.decode([2, 1, 2])
    assert (
        final_text(tok, [2, 1]) == "b"
    )  # (DecodeStream holds a text that ends in U+FFFD back, as vLLM)


def test_the_offline_api_leaves_a_cut_character_out(tok):
    """LLM.generate's text too (engine/engine.py ``_detokenize``), not the server's alone."""
    from outpace import LLM, SamplingParams

    first_byte = tok.encode("中", add_special_tokens=False)[0]
    params = SamplingParams(max_tokens=1, allowed_token_ids=[first_byte], temperature=0)
    out = LLM(str(ZOO), device="cpu").generate(["x"], params)[0].outputs[0]
    assert out.token_ids == [first_byte]
    assert out.text == ""
