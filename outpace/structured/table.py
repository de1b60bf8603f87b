"""The runner's grammars: one ``RequestGrammar`` per running request with ``structured_outputs``, and the
masks of a step's batch.

A request's grammar is built when the request is first scheduled (its constraint was compiled at
admission, so this is a cache hit) from the output it already has, and dropped when its row is freed
(finish, abort, preemption): a preempted request's grammar is rebuilt from its output when it runs again.
"""

from __future__ import annotations

from typing import Sequence

import torch

from outpace.layers.logits_processing import bitmask_words
from outpace.request import Request
from outpace.structured.grammar import GrammarCompiler, RequestGrammar


class GrammarTable:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._of: dict[str, RequestGrammar] = {}

    @property
    def mask_words(self) -> int:
        """int32 words of one bitmask (``tree_masks``' last dimension)."""
        return bitmask_words(self.compiler.vocab_size)

    def check(self, req: Request) -> None:
        """At admission: the request's constraint compiles (ValueError naming it otherwise)."""
        if req.params.structured_outputs is not None:
            self.compiler.compile(req.params.structured_outputs)

    def get(self, req: Request) -> RequestGrammar | None:
        """The request's grammar state (after its committed output), or None when it has no constraint."""
        spec = req.params.structured_outputs
        if spec is None:
            return None
        grammar = self._of.get(req.request_id)
        if grammar is None:
            grammar = self._of[req.request_id] = self.compiler.matcher(spec, req.output_token_ids)
        return grammar

    def release(self, request_id: str) -> None:
        self._of.pop(request_id, None)

    def next_token_masks(self, reqs: Sequence[Request], rows: int) -> torch.Tensor:
        """[rows, 1, words] int32 (host): each request's bitmask for its next token, after its committed output
        (a tree of node 0 alone; rows past ``reqs``: no constraint)."""
        none = torch.zeros(rows, 1, dtype=torch.int64)  # node 0, no parent
        return self.tree_masks(reqs, none, none - 1)

    def tree_masks(
        self, reqs: Sequence[Request], tokens: torch.Tensor, parents: torch.Tensor
    ) -> torch.Tensor:
        """[rows, n, words] int32 (host): each row's bitmask at every node of its draft tree; ``tokens``,
        ``parents`` [rows, n] (host; rows past ``reqs`` are padding: no constraint)."""
        rows, n = tokens.shape
        masks = torch.full((rows, n, self.mask_words), -1, dtype=torch.int32)
        token_lists, parent_lists = tokens.tolist(), parents.tolist()
        for i, req in enumerate(reqs):
            grammar = self.get(req)
            if grammar is not None:
                grammar.fill_tree(token_lists[i], parent_lists[i], masks[i])
        return masks
