"""Incremental detokenization: the text of a growing output without re-decoding all of it.

Where the tokenizer has a Rust backend (``tokenizers.Tokenizer``), its ``DecodeStream`` does the work: each step
feeds it only the new tokens and appends the chunk it returns (about 0.7 us a token on the zoo tokenizer, against
6.3 us for two Python-side decodes). A tokenizer without one, or one that cleans up spaces after decoding
(``clean_up_tokenization_spaces``, which ``DecodeStream`` does not apply), decodes through ``tokenizer.decode``:
each step decodes the tokens since ``prefix_offset`` (a few tokens of left context, so that pieces that depend
on their neighbours decode the same way) and appends what is new. Either way text is held back while the
newest tokens end inside a multi-byte character. The final text of a finished request is decoded in one piece.

A final text must not end in the U+FFFD of a character its tokens left unfinished (max_tokens or a stop token
cut it after some of its byte tokens): ``final_text`` (the engine's final text: engine/engine.py ``_detokenize``)
leaves out the tokens that hold it, as vLLM's incremental detokenizer never emits them.
A U+FFFD the model wrote whole (the three bytes of the character itself) stays.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers.decoders import DecodeStream

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@dataclass
class DetokenizerState:
    text: str = ""
    prefix_offset: int = 0  # start of the context window (in output tokens); decode path only
    read_offset: int = 0  # output tokens already turned into ``text``
    stream: DecodeStream | None = None  # the Rust backend's decoder, once the first tokens reach it


def streaming_backend(tokenizer):
    """The ``tokenizers.Tokenizer`` that ``DecodeStream`` steps for ``tokenizer``, or None where decoding must
    go through ``tokenizer.decode``."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    return getattr(tokenizer, "backend_tokenizer", None)


def update_text(
    tokenizer, ids: list[int], state: DetokenizerState, skip_special_tokens: bool = True
) -> str:
    """Bring ``state.text`` up to ``ids`` (the output so far) and return it (special tokens left out unless
    ``skip_special_tokens`` is False)."""
    backend = streaming_backend(tokenizer)
    if backend is not None:
        if state.stream is None:
            state.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        if len(ids) > state.read_offset:
            chunk = state.stream.step(backend, ids[state.read_offset :])
            state.read_offset = len(ids)
            if chunk:
                state.text += chunk
        return state.text
    decode = lambda part: tokenizer.decode(part, skip_special_tokens=skip_special_tokens)  # noqa: E731
    seen = decode(ids[state.prefix_offset : state.read_offset])
    current = decode(ids[state.prefix_offset :])
    if len(current) > len(seen) and not current.endswith("\ufffd"):
        state.text += current[len(seen) :]
        state.prefix_offset, state.read_offset = state.read_offset, len(ids)
    return state.text


def final_text(tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The text of a finished output's ``ids``, less the tokens that hold an unfinished character at its end."""
    text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    if not text.endswith("\ufffd"):
        return text
    ids = list(ids)
    keep = len(ids) - unfinished_tokens(tokenizer, ids, skip_special_tokens)
    return tokenizer.decode(ids[:keep], skip_special_tokens=skip_special_tokens)


def unfinished_tokens(tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> int:
    """How many of the last ``ids`` hold the bytes of a UTF-8 character they begin and do not finish (0: the text
    ends on a whole character, or the tokens' bytes are not known); special tokens the text skips count with them.
    An unfinished character is at most 3 bytes, so the tokens that make the last 3 bytes tell."""
    skipped = set(tokenizer.all_special_ids) if skip_special_tokens else set()
    byte_level = _is_byte_level(tokenizer)
    data, ends = b"", []  # ends: (tokens from the end, bytes from the end) at each token with bytes
    for count, token_id in enumerate(reversed(ids), 1):
        if len(data) >= 3:
            break
        if token_id not in skipped:
            data = _token_bytes(tokenizer.convert_ids_to_tokens(token_id), byte_level) + data
            ends.append((count, len(data)))
    unfinished = _unfinished_bytes(data)
    return next((count for count, size in ends if size >= unfinished), 0) if unfinished else 0


def _unfinished_bytes(data: bytes) -> int:
    """How many of the last bytes of ``data`` begin a UTF-8 character that more bytes could finish (those
    an incremental decoder holds back; a byte no character begins with, or a sequence already invalid, it
    replaces at once)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data[-3:])
    return len(decoder.getstate()[0])


def _is_byte_level(tokenizer) -> bool:
    """Whether the tokenizer's decoder reads tokens as bytes written in GPT-2's byte alphabet (byte-level BPE)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return False
    state = json.loads(decoder.__getstate__())
    return any(d.get("type") == "ByteLevel" for d in state.get("decoders", [state]))


def _token_bytes(token: str | None, byte_level: bool) -> bytes:
    """The bytes a vocabulary entry stands for: a byte fallback's one byte (``<0xC3>``), a byte-level token's bytes,
    else the entry's own text (an added token's, a SentencePiece piece's)."""
    token = token or ""
    byte = _BYTE_TOKEN.fullmatch(token)
    if byte is not None:
        return bytes([int(byte[1], 16)])
    alphabet = _byte_alphabet()
    if byte_level and all(c in alphabet for c in token):
        return bytes(alphabet[c] for c in token)
    return token.encode()


@functools.cache
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte alphabet: the character that writes each byte in a byte-level BPE vocabulary (the printable
    Latin-1 bytes themselves, the other 68 the characters from U+0100 on, in byte order)."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(0x100 + n): b for n, b in enumerate(moved)}
