"""Incremental detokenization: the text of a growing output without re-decoding all of it, equal to vLLM's.

A tokenizer with a Rust backend (``tokenizers.Tokenizer``: transformers' ``PreTrainedTokenizerFast``, whatever its
``clean_up_tokenization_spaces``) goes through that backend's ``DecodeStream``, as in vLLM's
``FastIncrementalDetokenizer`` (vllm/v1/engine/detokenizer.py): the stream is primed with the prompt's ids (so the
first output tokens decode in their context: a SentencePiece piece's leading space stays, a character the prompt
began is finished), then stepped one output token at a time, and the text is the concatenation of the chunks it
returns. A chunk is held back while the decoded text ends in U+FFFD (a character not finished yet, or bytes no
character can be made of), and what is held when the request finishes is never emitted: the final text is this
incremental text, not a re-decode of the output (vLLM's ``get_next_output_text`` returns ``output_text``).
A tokenizer without one (a Python, "slow" tokenizer) goes through vLLM's ``SlowIncrementalDetokenizer`` rules
(``detokenize_incrementally``, vllm/tokenizers/detokenizer_utils.py): the token strings of the prompt's last tokens
start a window, each output token's string is appended, and the window's ``convert_tokens_to_string`` less that of
the window without it is let out unless it is not longer or ends in U+FFFD. Its final text is that incremental text
too. Neither path applies ``clean_up_tokenization_spaces`` (``tokenizer.decode`` does; vLLM never calls it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers.decoders import DecodeStream


@dataclass
class DetokenizerState:
    text: str = ""
    num_ids: int = 0  # output ids already turned into ``text``
    stream: DecodeStream | None = None  # the Rust backend's decoder, once the first tokens reach it
    # Python path (vLLM's SlowIncrementalDetokenizer): the strings of the prompt's last tokens and of the output's,
    # the start of the window decoded for context, and the end of what is already in ``text`` (both in ``tokens``)
    tokens: list[str] | None = None
    prefix_offset: int = 0
    read_offset: int = 0


def streaming_backend(tokenizer):
    """The ``tokenizers.Tokenizer`` that ``DecodeStream`` steps for ``tokenizer``, or None where it has none.
    NOTE: vLLM takes the fast path for every ``PreTrainedTokenizerFast`` (vllm/v1/engine/detokenizer.py
    ``IncrementalDetokenizer.from_new_request``), one with ``clean_up_tokenization_spaces`` included: ``DecodeStream``
    does not clean spaces up, and neither does vLLM's text."""
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
    if backend is not None and state.stream is None:
        _prime(state, backend, list(prompt_ids), skip_special_tokens)
    elif backend is None and state.tokens is None:
        _start(state, tokenizer, prompt_ids, skip_special_tokens)
    # NOTE: one token a step, as vLLM's BaseIncrementalDetokenizer.update does: a list stepped at once lets nothing
    # out when it ends inside a character, which would lose its whole characters at the end of a request
    for token in ids[state.num_ids :]:
        if backend is not None:
            state.text += _step(state, backend, token, skip_special_tokens)
        else:
            state.text += _next_text(state, tokenizer, token, skip_special_tokens)
    state.num_ids = len(ids)
    return state.text


def final_text(
    tokenizer,
    ids: Sequence[int],
    skip_special_tokens: bool = True,
    prompt_ids: Sequence[int] = (),
    state: DetokenizerState | None = None,
) -> str:
    """The text of a finished output's ``ids`` (after ``prompt_ids``): the incremental text (``state``, carried on
    where it was used for stop strings or streaming, else a fresh one), as vLLM returns it. So a character its last
    tokens began and did not finish is left out, and so is a U+FFFD the text ends in."""
    if state is None or state.num_ids > len(ids):
        state = DetokenizerState()
    return update_text(tokenizer, ids, state, skip_special_tokens, prompt_ids)


# ---- Python tokenizers: vLLM's SlowIncrementalDetokenizer ----------------------------------------------------
# Prompt tokens decoded before the output (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET)
_PROMPT_CONTEXT = 5


def _strings(tokenizer, ids: Sequence[int], skip_special_tokens: bool) -> list[str]:
    """The tokens' strings (``convert_ids_to_tokens``: a skipped special token has none), "" for an unknown one."""
    strings = tokenizer.convert_ids_to_tokens(list(ids), skip_special_tokens=skip_special_tokens)
    return [s or "" for s in strings]


def _start(state: DetokenizerState, tokenizer, prompt_ids: Sequence[int], skip: bool) -> None:
    """vLLM's ``convert_prompt_ids_to_tokens``: the strings of the prompt's last ``_PROMPT_CONTEXT`` + 2 tokens (2
    more for special tokens it may skip), the window starting ``_PROMPT_CONTEXT`` strings before their end."""
    state.tokens = _strings(tokenizer, prompt_ids[-_PROMPT_CONTEXT - 2 :], skip)
    state.read_offset = len(state.tokens)
    state.prefix_offset = max(state.read_offset - _PROMPT_CONTEXT, 0)


def _next_text(state: DetokenizerState, tokenizer, token: int, skip: bool) -> str:
    """vLLM's ``detokenize_incrementally``: the text ``token`` lets out ("" while held back). The window from
    ``prefix_offset`` is decoded with and without the strings after ``read_offset``; what the first adds is let out
    unless it is not longer or ends in U+FFFD (a character not finished yet), and the window moves on."""
    in_vocab = 0 <= token < len(tokenizer)  # (an id past the vocabulary is "")
    state.tokens += _strings(tokenizer, [token], skip) if in_vocab else [""]
    seen = _tokens_to_string(tokenizer, state.tokens[state.prefix_offset : state.read_offset], skip)
    now = _tokens_to_string(tokenizer, state.tokens[state.prefix_offset :], skip)
    if len(now) <= len(seen) or now.endswith("\ufffd"):
        return ""
    state.prefix_offset, state.read_offset = state.read_offset, len(state.tokens)
    return now[len(seen) :]


def _tokens_to_string(tokenizer, tokens: list[str], skip: bool) -> str:
    """The text of ``tokens`` as vLLM's slow path makes it: ``convert_tokens_to_string``, but where the tokenizer
    has added tokens each of them stands alone and the runs between go through ``convert_tokens_to_string``, all
    joined by spaces (``_convert_tokens_to_string_with_added_encoders`` with ``spaces_between_special_tokens``,
    vLLM's default and the only value outpace takes); special tokens are left out there when skipped."""
    added = tokenizer.get_added_vocab()
    if getattr(tokenizer, "is_fast", False) or not added:
        return tokenizer.convert_tokens_to_string(tokens)
    skipped = set(tokenizer.all_special_tokens) if skip else set()
    parts, run = [], []
    for token in tokens:
        if token in skipped:
            continue
        if token in added:
            if run:
                parts.append(tokenizer.convert_tokens_to_string(run))
                run = []
            parts.append(token)
        else:
            run.append(token)
    if run:
        parts.append(tokenizer.convert_tokens_to_string(run))
    return " ".join(parts)
