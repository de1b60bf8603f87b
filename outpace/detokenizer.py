"""Incremental detokenization: the text of a growing output without re-decoding all of it.

Where the tokenizer has a Rust backend (``tokenizers.Tokenizer``), its ``DecodeStream`` does the work: each step
feeds it only the new tokens and appends the chunk it returns (about 0.7 us a token on the zoo tokenizer, against
6.3 us for two Python-side decodes). A tokenizer without one, or one that cleans up spaces after decoding
(``clean_up_tokenization_spaces``, which ``DecodeStream`` does not apply), decodes through ``tokenizer.decode``:
each step decodes the tokens since ``prefix_offset`` (a few tokens of left context, so that pieces that depend
on their neighbours decode the same way) and appends what is new. Either way text is held back while the
newest tokens end inside a multi-byte character. The final text of a finished request is decoded in one piece.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers.decoders import DecodeStream


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
