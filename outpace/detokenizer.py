"""Incremental detokenization: the text of a growing output without re-decoding all of it, equal to vLLM's.

Where the tokenizer has a Rust backend (``tokenizers.Tokenizer``), its ``DecodeStream`` does the work, as in vLLM's
``FastIncrementalDetokenizer`` (vllm/v1/engine/detokenizer.py): the stream is primed with the prompt's ids (so the
first output tokens decode in their context: a SentencePiece piece's leading space stays, a character the prompt
began is finished), then stepped one output token at a time, and the text is the concatenation of the chunks it
returns. A chunk is held back while the decoded text ends in U+FFFD (a character not finished yet, or bytes no
character can be made of), and what is held when the request finishes is never emitted: the final text is this
incremental text, not a re-decode of the output (vLLM's ``get_next_output_text`` returns ``output_text``).
A tokenizer without a backend decodes through ``tokenizer.decode``: each step decodes the tokens since
``prefix_offset`` (a few tokens of left context) and appends what is new, holding back text that ends in U+FFFD;
its final text is decoded in one piece, less the tokens of a character its last tokens left unfinished
(``final_text``).
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


# What tokenizers' DecodeStream raises when the decoded window no longer starts with the text it already emitted
# (byte-fallback runs that are not UTF-8 decode to one U+FFFD a byte, so a later byte can change earlier text).
_INVALID_PREFIX = "Invalid prefix encountered"


_PRIME_WINDOW = 24  # (vLLM's: the longest prompt suffix it stepped)


def _step(state: DetokenizerState, backend, token: int, skip_special_tokens: bool) -> str:
    """One output token through ``state.stream``: the text it lets out ("" while held back)."""
    try:
        chunk = state.stream.step(backend, token)
    except Exception as error:
        if not str(error).startswith(_INVALID_PREFIX):
            raise
        # NOTE: vLLM's FastIncrementalDetokenizer._protected_step (vllm-project/vllm#17448): the stream's state is
        # broken; a fresh stream (no context) steps the token, and the text emitted so far stays as it is.
        state.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        chunk = state.stream.step(backend, token)
    return chunk or ""


def _prime(
    state: DetokenizerState, backend, prompt_ids: list[int], skip_special_tokens: bool
) -> None:
    """Start ``state.stream`` on the prompt, as vLLM's FastIncrementalDetokenizer does, so that the output decodes
    in its context. The prompt up to a point where its text ends on a whole character goes to the stream at once
    (``DecodeStream(ids=...)``); the tokens after it (at most ``_PRIME_WINDOW``) are stepped one by one, what they
    let out dropped.
    NOTE: not the whole prompt at once (vLLM's latest ``DecodeStream(ids=prompt_token_ids)``): where the prompt
    ends inside a character, that stream lets the prompt's whole text out with the token that finishes it. Stepped,
    the output's text begins with that character, as with vLLM's earlier priming (a suffix of up to 24 prompt
    tokens whose text holds no U+FFFD, else the prompt, stepped token by token)."""
    cut = len(prompt_ids)
    while cut > 0 and len(prompt_ids) - cut < _PRIME_WINDOW:
        if not backend.decode(prompt_ids[max(0, cut - 8) : cut], skip_special_tokens).endswith(
            "\ufffd"
        ):
            break
        cut -= 1
    state.stream = DecodeStream(ids=prompt_ids[:cut], skip_special_tokens=skip_special_tokens)
    for token in prompt_ids[cut:]:
        _step(state, backend, token, skip_special_tokens)


def update_text(
    tokenizer,
    ids: Sequence[int],
    state: DetokenizerState,
    skip_special_tokens: bool = True,
    prompt_ids: Sequence[int] = (),
) -> str:
    """Bring ``state.text`` up to ``ids`` (the output so far, after ``prompt_ids``) and return it (special tokens
    left out unless ``skip_special_tokens`` is False)."""
    backend = streaming_backend(tokenizer)
    if backend is not None:
        if state.stream is None:
            _prime(state, backend, list(prompt_ids), skip_special_tokens)
        # NOTE: one token a step, as vLLM's BaseIncrementalDetokenizer.update does: a list stepped at once lets
        # nothing out when it ends inside a character, which would lose its whole characters at the end of a request
        for token in ids[state.read_offset :]:
            state.text += _step(state, backend, token, skip_special_tokens)
        state.read_offset = len(ids)
        return state.text
    decode = lambda part: tokenizer.decode(part, skip_special_tokens=skip_special_tokens)  # noqa: E731
    seen = decode(ids[state.prefix_offset : state.read_offset])
    current = decode(ids[state.prefix_offset :])
    if len(current) > len(seen) and not current.endswith("\ufffd"):
        state.text += current[len(seen) :]
        state.prefix_offset, state.read_offset = state.read_offset, len(ids)
    return state.text


def final_text(
    tokenizer,
    ids: Sequence[int],
    skip_special_tokens: bool = True,
    prompt_ids: Sequence[int] = (),
    state: DetokenizerState | None = None,
) -> str:
    """The text of a finished output's ``ids`` (after ``prompt_ids``). With a Rust backend, the incremental text
    (``state``, carried on where it was used for stop strings or streaming, else a fresh one), as vLLM returns it;
    otherwise the decode of ``ids`` less the tokens that hold an unfinished character at its end."""
    if streaming_backend(tokenizer) is not None:
        if state is None or state.read_offset > len(ids):
            state = DetokenizerState()
        return update_text(tokenizer, ids, state, skip_special_tokens, prompt_ids)
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
