"""The runner's grammars: one ``RequestGrammar`` per running request with ``structured_outputs``, and the
masks of a step's batch.

A request's grammar is built when the request is first scheduled (its constraint was compiled at
admission, so this is a cache hit) from the output it already has, and dropped when its row is freed
(finish, abort, preemption): a preempted request's grammar is rebuilt from its output when it runs again.
"""

from __future__ import annotations

from functools import cached_property
from typing import Sequence

import torch

from outpace.host_copies import to_device
from outpace.layers.logits_processing import bitmask_words
from outpace.request import Request
from outpace.structured.grammar import GrammarCompiler, GrammarDeadEnd, RequestGrammar, stop_mask


class GrammarTable:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._of: dict[str, RequestGrammar] = {}

    @cached_property
    def _stop_only(self) -> torch.Tensor:
        """[words] int32: what a dead end allows (``tree_masks``), made by the first step with a constraint (not at
        start-up: a model may name an end-of-sequence id its head lacks)."""
        return stop_mask(self.compiler.vocab_size, self.compiler.stop_token_ids)

    def __len__(self) -> int:
        """Requests holding a grammar state (none once every constrained request has left its row)."""
        return len(self._of)

    @property
    def mask_words(self) -> int:
        """int32 words of one bitmask (``tree_masks``' last dimension)."""
        return bitmask_words(self.compiler.vocab_size)

    def check(self, req: Request) -> None:
        """At admission: the request's constraint compiles and some output satisfies it (ValueError naming it
        otherwise)."""
        if req.params.structured_outputs is not None:
            self.compiler.check(req.params.structured_outputs)

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

    def failure(self, req: Request) -> GrammarDeadEnd | None:
        """The dead end the request's committed tokens reached (grammar.py), which ends it; None: none."""
        grammar = self._of.get(req.request_id)
        return None if grammar is None else grammar.failure

    def next_token_masks(self, reqs: Sequence[Request], out: torch.Tensor) -> torch.Tensor:
        """Each request's bitmask for its next token, after its committed output, into ``out`` [rows, 1, words]
        (``tree_masks`` of node 0 alone); returns ``out``."""
        none = torch.zeros(out.shape[0], 1, dtype=torch.int64)  # node 0, no parent
        return self.tree_masks(reqs, none, none - 1, out)

    def tree_masks(
        self,
        reqs: Sequence[Request],
        tokens: torch.Tensor,
        parents: torch.Tensor,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Each row's bitmask at every node of its draft tree into ``out`` [rows, n, words] int32 (on any device),
        returned; ``tokens``, ``parents`` [rows, n] (host). A row without a constraint (padding rows past ``reqs``
        among them) allows every token; a node at a dead end (grammar.py) allows the stop tokens alone. Only the
        constrained rows' masks are built on the host and copied over, from page-locked memory behind the queued
        kernels (``to_device``: the host does not wait for the GPU): one JSON request in a batch of 32 at Llama-3's
        128,256 tokens and 6 nodes a row is 96 KB, where the whole batch's masks were 3 MB, filled and copied (from
        pageable memory: a wait) at every step."""
        out.fill_(-1)
        constrained = [(i, g) for i, req in enumerate(reqs) if (g := self.get(req)) is not None]
        if not constrained:
            return out
        host = torch.full(
            (len(constrained), tokens.shape[1], self.mask_words), -1, dtype=torch.int32
        )
        token_lists, parent_lists = tokens.tolist(), parents.tolist()
        for j, (i, grammar) in enumerate(constrained):
            grammar.fill_tree(token_lists[i], parent_lists[i], host[j])
        host[~host.any(dim=-1)] = self._stop_only  # dead ends
        rows = to_device([i for i, _ in constrained], out.device)
        return out.index_copy_(0, rows, to_device(host, out.device, torch.int32))
