"""The interface every drafter implements, and the data that crosses it.

Per engine step a proposer sees two calls, in this order:
- ``propose(requests)`` for the requests in decode: draft tokens for each, as a ``DraftBatch``.
- ``observe(rows)`` after the target forward: the target rows that were *committed* in this
  step (prefill chunks, and each verify's accepted path), with the token that follows each row.
  A drafter brings its own state (draft KV, pending hidden states) up to date from these.
Drafters share the target's block tables (one ``BlockPool``): a request's draft KV lives at the
same rows as its target KV, in the drafter's own tensors, so no second allocator exists.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from outpace.request import Request


@dataclass
class DraftBatch:
    """Draft tokens for ``batch`` requests as trees of ``num_nodes`` nodes (a chain is the tree
    where node i's parent is i - 1). Node 0 is the last accepted token, which is not a draft."""

    token_ids: torch.Tensor           # [batch, num_nodes] int64 target-vocabulary ids
    parents: torch.Tensor             # [batch, num_nodes] int64, -1 for node 0
    depths: torch.Tensor              # [batch, num_nodes] int64, 0 for node 0
    is_chain: bool
    # Chain with sampled drafts: q at each draft position, [batch, num_nodes - 1, vocab];
    # None when drafts were chosen deterministically (greedy or top-k trees).
    draft_probs: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.token_ids.shape[1]


@dataclass
class CommittedRows:
    """Target rows committed in one step, grouped by request (in ``requests`` order)."""

    requests: list[Request]
    starts: list[int]                 # position of each request's first committed row
    counts: list[int]                 # committed rows per request
    rows: torch.Tensor                # [total] int64 row index into the forward's output
    next_token_ids: torch.Tensor      # [total] int64 the token that follows each committed row
    hidden_states: torch.Tensor       # [num_rows_in_forward, hidden] target pre-norm last hidden
    aux_hidden_states: torch.Tensor | None  # [num_rows_in_forward, num_aux * hidden]


def merge_pending(chunks: list[tuple]) -> tuple:
    """A request's pending chunks ``[(row tensors..., first row)]`` (contiguous rows, in order) as one."""
    return (*(torch.cat([c[i] for c in chunks]) for i in range(len(chunks[0]) - 1)), chunks[0][-1])


def split_pending(chunks: list[tuple], keep: int) -> tuple[tuple | None, tuple]:
    """A request's pending chunks as two chunks: the rows to absorb into the draft KV now (all but
    the last ``keep``; None when there are no more than ``keep``) and the last ``keep`` rows, which
    stay pending."""
    *rows, start = merge_pending(chunks)
    excess = rows[0].shape[0] - keep
    if excess <= 0:
        return None, (*rows, start)
    return (*(r[:excess] for r in rows), start), (*(r[excess:] for r in rows), start + excess)


def take_excess_rows(pending: dict[str, list[tuple]], requests: list[Request], keep: int) -> tuple[list, list]:
    """For each request whose pending rows (``pending[request_id]``, chunks as in ``split_pending``)
    exceed ``keep``: leave the last ``keep`` pending and take the others out. Returns those requests
    and, for each, the chunk of rows taken (for the drafter to absorb into its KV now)."""
    taken_from, taken = [], []
    for r in requests:
        absorb, kept = split_pending(pending[r.request_id], keep)
        if absorb is not None:
            pending[r.request_id] = [kept]
            taken_from.append(r)
            taken.append(absorb)
    return taken_from, taken


class Proposer(abc.ABC):
    """A drafter. ``lookahead``: KV rows past a request's last accepted token that it may write
    (the scheduler reserves them, together with the target's verify rows)."""

    # Target layers whose inputs the drafter needs (see ModelConfig aux convention); () for none.
    aux_layer_ids: tuple[int, ...] = ()

    def __init__(self, spec, pool, device: str, attention_backend: str = "torch") -> None:
        """What every drafter keeps: its config, the shared block pool, its device and attention backend."""
        from outpace.attention.registry import get_backend

        self.spec = spec
        self.pool = pool
        self.device = torch.device(device)
        self.backend = get_backend(attention_backend)

    @property
    @abc.abstractmethod
    def lookahead(self) -> int: ...

    @abc.abstractmethod
    def propose(self, requests: list[Request]) -> DraftBatch: ...

    @abc.abstractmethod
    def observe(self, committed: CommittedRows) -> None: ...

    @abc.abstractmethod
    def release(self, request_id: str) -> None:
        """Forget a request (finished, aborted or preempted)."""
