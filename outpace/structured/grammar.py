"""Grammars for structured output, through xgrammar (imported on first use: ``pip install outpace[structured]``).

A ``GrammarCompiler`` turns a request's ``StructuredOutputsParams`` into xgrammar's compiled grammar
for the engine's tokenizer and vocabulary (compiled once per distinct constraint: xgrammar caches).
A ``RequestGrammar`` is one request's parser state: it has accepted exactly the request's committed
output tokens, and answers, for a draft tree of the next step, the token bitmask at every node as if
the node's path had been committed (accepting the path's drafts, filling the mask, rolling back):
- a node whose path leaves the grammar gets an all-allowing mask: it is unreachable, since the target
  gives the draft that leaves the grammar probability 0 (its mask at the parent forbids it), so the
  verify rejects the path at that draft;
- a node whose path ends the grammar (its stop token accepted) allows the stop tokens alone, so
  nothing past the grammar's end can be accepted; the engine stops at the stop token (an eos id).
After the verify only the committed tokens are accepted (``accept``): the drafts' advance was undone
at once, which is the rollback of rejected drafts.

A constraint with ``starts_after`` (a reasoning model's "</think>") is a ``GatedGrammar``: every mask allows
anything until that text's tokens are in the output, or on a draft path until they complete there.

JSON (a schema or ``json_object``) is generated compactly, with no free whitespace between tokens
(xgrammar's ``any_whitespace=False``), so a model cannot stall in whitespace until max_tokens.
A schema's ``$ref`` must resolve inside the schema: xgrammar lets any value through where a reference
leaves it (another file, a URL, an anchor), so such a schema is refused rather than run unconstrained.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Sequence
from urllib.parse import unquote

import torch

from outpace.layers.logits_processing import BITS_PER_WORD, bitmask_words
from outpace.sampling_params import StructuredOutputsParams


class ConstraintError(ValueError):
    """A constraint that does not compile: ``kind`` names its field of ``StructuredOutputsParams`` (json,
    regex, choice, grammar, json_object) and ``detail`` says why, without xgrammar's internals."""

    def __init__(self, kind: str, detail: str) -> None:
        # NOTE: both in args, so that it pickles (a data-parallel replica sends it back).
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail

    def __str__(self) -> str:
        return f"structured_outputs.{self.kind} does not compile: {self.detail}"


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ValueError(
            "structured_outputs needs the xgrammar package: pip install 'outpace[structured]'"
        ) from e
    return xgrammar


class GrammarCompiler:
    """Compiles constraints for one tokenizer; ``stop_token_ids``: the engine's eos ids (a grammar ends
    on one of them)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler = None
        self._building = threading.Lock()  # admission checks compile on the server's worker threads

    def _compiler_or_build(self):
        with self._building:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise ValueError(
                        "structured_outputs needs the model's tokenizer, and this model has none"
                    )
                if not self.stop_token_ids:
                    raise ValueError(
                        "structured_outputs needs an end-of-sequence token id, and this model has none"
                    )
                xgr = _xgrammar()
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=2)
            return self._compiler

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar; a constraint that does not compile raises ``ConstraintError``."""
        compiler, kind = self._compiler_or_build(), spec.kind
        if kind == "json":
            schema = _parsed_schema(spec.json)
            _check_refs(schema, schema)
        try:
            if kind == "json":
                return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(spec.regex)
            if (
                kind == "choice"
            ):  # GBNF string literals take JSON's escapes (a character past U+FFFF
                # written as itself: escaped, a surrogate pair reads as two code points, invalid UTF-8)
                return compiler.compile_grammar(
                    "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
                )
            return compiler.compile_grammar(spec.grammar)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with its parser's message
            raise ConstraintError(kind, _parser_message(e)) from None

    def matcher(
        self, spec: StructuredOutputsParams, output_token_ids: Sequence[int] = ()
    ) -> RequestGrammar:
        """A request's grammar state after ``output_token_ids`` (its committed output so far)."""
        grammar = RequestGrammar(
            _xgrammar().GrammarMatcher(self.compile(spec)), self.vocab_size, self.stop_token_ids
        )
        if spec.starts_after is not None:
            marker = self.tokenizer.encode(spec.starts_after, add_special_tokens=False)
            grammar = GatedGrammar(grammar, marker)
        grammar.accept(output_token_ids)
        return grammar


class RequestGrammar:
    def __init__(self, matcher, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size
        self.words = bitmask_words(vocab_size)
        self.stop_only = torch.zeros(
            self.words, dtype=torch.int32
        )  # [words]: the stop tokens alone
        for t in stop_token_ids:
            self.stop_only[t // BITS_PER_WORD] |= _bit(t % BITS_PER_WORD)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def accept(self, tokens: Sequence[int]) -> None:
        """Accept committed tokens. A token the grammar forbids cannot have been committed (the target's
        distribution was masked): it is a bug, raised as one."""
        for t in tokens:
            if not self.matcher.accept_token(int(t)):
                raise RuntimeError(
                    f"the grammar refused committed token {t}: its mask was not applied"
                )

    def fill_tree(self, tokens: Sequence[int], parents: Sequence[int], out: torch.Tensor) -> None:
        """``out`` [n, words] int32 (host): the bitmask at each node of a draft tree (node 0: the last
        committed token, already accepted; ``parents[u]`` < u, -1 for node 0)."""
        for u in range(len(tokens)):
            self.fill_after(tree_path(tokens, parents, u), out, u)

    def fill_after(self, path: Sequence[int], out: torch.Tensor, row: int) -> None:
        """``out[row]``: the bitmask after the committed output and then ``path``."""
        accepted = 0
        for t in path:
            if not self.matcher.accept_token(t):  # also refused once the stop token is in
                break
            accepted += 1
        if accepted < len(path):
            out[row] = -1  # unreachable (see the module docstring): anything
        elif self.matcher.is_terminated():
            out[row] = self.stop_only
        else:
            self.matcher.fill_next_token_bitmask(out, row)
        if accepted:
            self.matcher.rollback(accepted)


def tree_path(tokens: Sequence[int], parents: Sequence[int], u: int) -> list[int]:
    """The draft tokens from node 0 (excluded) to node ``u`` of a tree, in order."""
    path = []
    while u > 0:
        path.append(int(tokens[u]))
        u = parents[u]
    return path[::-1]


def _bit(i: int) -> int:
    """Bit i of an int32 word, as a Python int of the word's signed value."""
    return (1 << i) - (1 << 32 if i == BITS_PER_WORD - 1 else 0)


# xgrammar's messages start with a log prefix naming its C++ source ("[07:18:49] /project/cpp/
# regex_converter.cc:83: ") and may hold a failed check's expression; the user needs neither.
_INTERNALS = re.compile(r"\[[\d:]+\] \S+:\d+: |Check failed: \(.*?\) is false: ")


def _parser_message(e: Exception) -> str:
    return _INTERNALS.sub("", str(e)).strip()[:500] or type(e).__name__


def _parsed_schema(schema: str | dict) -> Any:
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except ValueError as e:
        raise ConstraintError("json", f"the schema is not valid JSON: {e}") from None


_DATA_KEYWORDS = ("enum", "const", "default", "examples")  # values there are data, not schemas


def _check_refs(node: Any, root: Any) -> None:
    """Every ``$ref`` in the schema ``node`` points inside ``root`` (ConstraintError naming it otherwise)."""
    if isinstance(node, list):
        for item in node:
            _check_refs(item, root)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str):
        _resolve(ref, root)
    for key, value in node.items():
        if key not in _DATA_KEYWORDS:
            _check_refs(value, root)


def _resolve(ref: str, root: Any) -> None:
    """Follow a local reference (``#`` or a JSON pointer ``#/...``) through ``root``."""
    if ref != "#" and not ref.startswith("#/"):
        raise ConstraintError(
            "json",
            f"$ref {ref!r} cannot be resolved: only references inside the schema "
            "('#' or '#/...') are supported",
        )
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConstraintError(
                "json", f"$ref {ref!r} cannot be resolved: the schema has no {part!r} there"
            )


class GatedGrammar:
    """A grammar that holds only after ``marker`` (token ids) in the output (``starts_after``: a reasoning
    model's "</think>", as vLLM applies a constraint once the reasoning parser sees the thinking end): until the
    marker is committed, and on every draft path until it completes there, anything goes."""

    def __init__(self, inner: RequestGrammar, marker: Sequence[int]) -> None:
        self.inner, self.marker = inner, [int(t) for t in marker]
        self.open = False  # the marker is in the committed output
        self.tail: list[int] = []  # the committed output's last tokens, while not open

    def accept(self, tokens: Sequence[int]) -> None:
        if self.open:
            self.inner.accept(tokens)
            return
        at = self._after_marker(self.tail, [int(t) for t in tokens])
        if at is None:
            self.tail = (self.tail + [int(t) for t in tokens])[-len(self.marker) :]
            return
        self.open, self.tail = True, []
        self.inner.accept(tokens[at:])

    def fill_tree(self, tokens: Sequence[int], parents: Sequence[int], out: torch.Tensor) -> None:
        if self.open:
            self.inner.fill_tree(tokens, parents, out)
            return
        for u in range(len(tokens)):
            path = tree_path(tokens, parents, u)
            at = self._after_marker(self.tail, path)
            if at is None:
                out[u] = -1
            else:
                self.inner.fill_after(path[at:], out, u)

    def _after_marker(self, before: list[int], tokens: list[int]) -> int | None:
        """The index in ``tokens`` just past the first place where ``before + tokens`` completes the marker
        (None: it does not)."""
        seq, m = before + tokens, len(self.marker)
        for end in range(max(m, len(before) + 1), len(seq) + 1):
            if seq[end - m : end] == self.marker:
                return end - len(before)
        return None
