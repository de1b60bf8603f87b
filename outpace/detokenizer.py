"""Incremental detokenization: the text of a growing output without re-decoding all of it.

Each step decodes only the tokens since ``prefix_offset`` (a few tokens of left context, so that
tokenizers whose pieces depend on their neighbours decode the same way) and appends what is new.
Text is held back while the newest tokens end inside a multi-byte character (the decode then ends
in U+FFFD). The final text of a finished request is decoded in one piece.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetokenizerState:
    text: str = ""
    prefix_offset: int = 0  # start of the context window (in output tokens)
    read_offset: int = 0    # output tokens already turned into ``text``


def update_text(tokenizer, ids: list[int], state: DetokenizerState) -> str:
    """Bring ``state.text`` up to ``ids`` (the output so far) and return it."""
    decode = lambda part: tokenizer.decode(part, skip_special_tokens=True)  # noqa: E731
    seen = decode(ids[state.prefix_offset:state.read_offset])
    current = decode(ids[state.prefix_offset:])
    if len(current) > len(seen) and not current.endswith("\ufffd"):
        state.text += current[len(seen):]
        state.prefix_offset, state.read_offset = state.read_offset, len(ids)
    return state.text
