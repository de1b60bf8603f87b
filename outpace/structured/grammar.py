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

A grammar may reach a dead end: a point that no token continues and where it may not end (the grammar
``root ::= "ab" x`` with ``x ::= x "b"``, after "ab"). A constraint whose start is one (the schema
``{"$ref": "#"}``) is refused at admission; elsewhere the batch's masks give such a node the stop tokens
alone (GrammarTable ``tree_masks``), so its row samples a stop token, and the grammar, refusing it, records
``GrammarDeadEnd``: the engine ends that request alone with it (finish_reason "error", as vLLM ends a
request whose grammar refuses its tokens).

A constraint with ``starts_after`` (a reasoning model's "</think>") is a ``GatedGrammar``: every mask allows
anything until that text's tokens are in the output, or on a draft path until they complete there.

JSON (a schema or ``json_object``) is generated compactly, with no free whitespace between tokens
(xgrammar's ``any_whitespace=False``), so a model cannot stall in whitespace until max_tokens.
A schema's ``$ref`` must resolve inside the schema: xgrammar lets any value through where a reference
leaves it (another file, a URL, an anchor), so such a schema is refused rather than run unconstrained.
A schema keyword xgrammar compiles but does not enforce (``multipleOf``, ``uniqueItems``, ``patternProperties``,
a string ``format`` it lacks, ...: vLLM's ``has_xgrammar_unsupported_json_features``) is refused by name.
A schema nests at most ``MAX_SCHEMA_DEPTH`` levels: xgrammar's compile time grows as the cube of the depth.
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


class GrammarDeadEnd(ValueError):
    """A request's grammar reached a dead end (the module docstring) after ``num_tokens`` tokens it accepted:
    the request fails with it, no other."""

    def __init__(self, kind: str, num_tokens: int) -> None:
        super().__init__(kind, num_tokens)  # (both in args, as ConstraintError's)
        self.kind, self.num_tokens = kind, num_tokens

    def __str__(self) -> str:
        return (
            f"structured_outputs.{self.kind} allows no token after {self.num_tokens} output "
            f"token{'s' * (self.num_tokens != 1)}: no text the tokenizer can write continues it "
            "there, and it may not end there"
        )


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
            _check_depth(schema)
            _check_refs(schema, schema)
            _check_features(schema)
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
            detail = _parser_message(e)
            if kind == "grammar" and "::=" not in spec.grammar:  # vLLM's test for a Lark grammar
                detail += (
                    " (it looks like a Lark grammar, which outpace does not read: write it in EBNF, "
                    'rule root first: root ::= "a" | "b")'
                )
            raise ConstraintError(kind, detail) from None

    def check(self, spec: StructuredOutputsParams) -> None:
        """At admission: the constraint compiles and some output satisfies it (``ConstraintError`` otherwise)."""
        if self._request_grammar(spec).at_dead_end():
            raise ConstraintError(
                spec.kind, "no output satisfies it (no text the tokenizer can write matches it)"
            )

    def matcher(
        self, spec: StructuredOutputsParams, output_token_ids: Sequence[int] = ()
    ) -> RequestGrammar:
        """A request's grammar state after ``output_token_ids`` (its committed output so far)."""
        grammar = self._request_grammar(spec)
        if spec.starts_after is not None:
            marker = self.tokenizer.encode(spec.starts_after, add_special_tokens=False)
            grammar = GatedGrammar(grammar, marker)
        grammar.accept(output_token_ids)
        return grammar

    def _request_grammar(self, spec: StructuredOutputsParams) -> RequestGrammar:
        matcher = _xgrammar().GrammarMatcher(self.compile(spec))
        return RequestGrammar(matcher, self.vocab_size, self.stop_token_ids, spec.kind)


def stop_mask(vocab_size: int, stop_token_ids: Sequence[int]) -> torch.Tensor:
    """[words] int32: the bitmask that allows the stop tokens alone (an id past the vocabulary has no logit to allow:
    a model's config may name an end-of-sequence id its head lacks)."""
    mask = torch.zeros(bitmask_words(vocab_size), dtype=torch.int32)
    for t in (t for t in stop_token_ids if t < vocab_size):
        mask[t // BITS_PER_WORD] |= _bit(t % BITS_PER_WORD)
    return mask


class RequestGrammar:
    """``kind``: the constraint's field (``StructuredOutputsParams.kind``), which ``failure`` names."""

    def __init__(self, matcher, vocab_size: int, stop_token_ids: Sequence[int], kind: str) -> None:
        self.matcher, self.vocab_size, self.kind = matcher, vocab_size, kind
        self.words = bitmask_words(vocab_size)
        self.stop_only = stop_mask(vocab_size, stop_token_ids)  # [words]
        self.num_accepted = 0
        self.failure: GrammarDeadEnd | None = None  # the dead end its committed tokens reached

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def accept(self, tokens: Sequence[int]) -> None:
        """Accept committed tokens. At a dead end the token committed (a stop token) is refused and recorded as
        ``failure``; elsewhere a token the grammar forbids cannot have been committed (the target's
        distribution was masked): it is a bug, raised as one."""
        for t in tokens if self.failure is None else ():
            if self.matcher.accept_token(int(t)):
                self.num_accepted += 1
            elif self.at_dead_end():
                self.failure = GrammarDeadEnd(self.kind, self.num_accepted)
                return
            else:
                raise RuntimeError(
                    f"the grammar refused committed token {t}: its mask was not applied"
                )

    def at_dead_end(self) -> bool:
        """No token continues the grammar after its accepted tokens, and it has not ended."""
        if self.matcher.is_terminated():
            return False
        mask = torch.zeros(1, self.words, dtype=torch.int32)
        self.matcher.fill_next_token_bitmask(mask, 0)
        return not mask.any()

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
    """xgrammar's message less its internals; where nothing is left (a check of its own failed), says so."""
    message = _INTERNALS.sub("", str(e)).strip()[:500]
    return message or "xgrammar failed an internal check on it (a simpler constraint may compile)"


# Levels of lists and dicts a schema may nest: xgrammar's compile time grows as the cube of the depth (on the
# CPU, 200 levels of "items" took 0.5 s, 800 took 25 s, 1,500 three minutes), and Python's json stops near 1,000.
MAX_SCHEMA_DEPTH = 100


def _parsed_schema(schema: str | dict) -> Any:
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as e:
        raise ConstraintError("json", f"the schema is not valid JSON: {e}") from None


def _check_depth(schema: Any) -> None:
    """The schema nests at most ``MAX_SCHEMA_DEPTH`` levels (walked without recursion, however deep it is)."""
    level, depth = [schema], 0
    while level := [v for v in level if isinstance(v, (dict, list, tuple))]:
        depth += 1
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_deep()
        level = [child for v in level for child in (v.values() if isinstance(v, dict) else v)]


def _too_deep() -> ConstraintError:
    return ConstraintError("json", f"the schema nests more than {MAX_SCHEMA_DEPTH} levels deep")


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


# Schema keywords xgrammar compiles but does not enforce (vLLM's ``has_xgrammar_unsupported_json_features``, which
# sends such a schema to another backend or refuses it): outpace, with xgrammar alone, refuses them by name.
_UNENFORCED_KEYWORDS = (
    "multipleOf",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "patternProperties",
    "propertyNames",
    "dependentSchemas",
)
# String formats xgrammar enforces (vLLM's STRING_SUPPORTED_FORMATS); another is refused.
_STRING_FORMATS = frozenset(
    "email date time date-time duration ipv4 ipv6 hostname uuid uri uri-reference uri-template "
    "json-pointer relative-json-pointer".split()
)
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # their values are schemas, their keys names


def _check_features(node: Any, at: str = "") -> None:
    """No schema in ``node`` uses a keyword xgrammar would silently not enforce (ConstraintError naming the
    keyword and where it is, as a JSON pointer)."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_features(item, f"{at}/{i}")
        return
    if not isinstance(node, dict):
        return
    where = at or "/"
    for key in _UNENFORCED_KEYWORDS:
        if key in node:
            raise ConstraintError(
                "json",
                f"the keyword {key!r} (at {where}) is not supported: xgrammar does not enforce it",
            )
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in _STRING_FORMATS:
        raise ConstraintError(
            "json",
            f"the string format {fmt!r} (at {where}) is not supported: xgrammar enforces "
            f"{', '.join(sorted(_STRING_FORMATS))}",
        )
    if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node):
        raise ConstraintError(
            "json",
            f"minLength/maxLength beside pattern or format (at {where}) is not supported: xgrammar "
            "enforces the pattern or format alone",
        )
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, schema in value.items():
                _check_features(schema, f"{at}/{key}/{name}")
        else:
            _check_features(value, f"{at}/{key}")


class GatedGrammar:
    """A grammar that holds only after ``marker`` (token ids) in the output (``starts_after``: a reasoning
    model's "</think>", as vLLM applies a constraint once the reasoning parser sees the thinking end): until the
    marker is committed, and on every draft path until it completes there, anything goes."""

    def __init__(self, inner: RequestGrammar, marker: Sequence[int]) -> None:
        self.inner, self.marker = inner, [int(t) for t in marker]
        self.open = False  # the marker is in the committed output
        self.tail: list[int] = []  # the committed output's last tokens, while not open

    @property
    def failure(self) -> GrammarDeadEnd | None:
        return self.inner.failure

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
