"""The interface every drafter implements, and the data that crosses it.

A drafter keeps its state per request row (engine/request_table.py) in device buffers that it
allocates itself; the engine's decode iteration (engine/decode_step.py) calls, per step,
- ``draft(rows, shape)``: draft tokens for every row of the batch, as a ``Drafts`` tree,
- ``update(verified)``: after the verify, record what the step committed (the accepted path's
  rows and the token after each), so the next ``draft`` can bring the draft state up to date.
Both are device work with static shapes (the batch's bucket, the ``DraftShape``): the same code
runs eagerly and inside a captured CUDA graph. Prefill chunks reach the drafter through
``absorb`` (eager, any shapes). Drafters share the target's block tables: a request's draft KV
lives at the same rows as its target KV, in the drafter's own tensors.

Holding. A drafter that keeps the rows committed since its last forward in a pending window
(``PendingRows``: EAGLE3, MTP) runs its forward over that window at the next ``draft``. A zero-draft
step (plain decoding, which adaptive speculation chooses where drafts do not pay) needs no draft, so
such a drafter may "hold" it: the step calls neither ``draft`` nor ``update`` but ``hold``, which
appends the step's one committed row to the window, and the next forward runs over the held rows too.
The drafter's KV then ends as it would have had every step run the forward: each held row's KV is
written by the next forward from the same inputs (its state, the committed tokens after it), and no
row is skipped (the window keeps them until then); so drafts, acceptance and output are unchanged,
and a held step costs what plain decoding costs. The window has
``HOLD_ROWS`` rows more than a verify commits. The host bounds each request's pending rows
(engine/step_key.py ``HoldRule``): a zero-draft step that could overflow some request's window "flushes"
instead: ``draft`` and ``update`` as at any step, which empty it. A forward runs over the whole window
only where some request of the batch holds rows from held steps; otherwise over the narrow window, the
rows a verify leaves (``PendingRows.narrow``: both are captured steps), so that drafting, which
adaptive speculation chooses where it pays, costs nothing for the rows it may hold.

A drafter never imports the engine: what it needs arrives in ``DecodeRows`` and ``Verified``.
"""

from __future__ import annotations

import abc
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from outpace.attention import forward_context, uniform_paged_metadata
from outpace.attention.registry import get_backend
from outpace.checkpoint import (
    CheckpointError,
    checkpoint_files,
    checkpoint_tensor_names,
    weight_files_named,
)
from outpace.layers.sampler import SamplingTensors, random_keys
from outpace.request import DRAWS
from outpace.speculative.verify import VerifyResult
from outpace.validation import ConfigError


@dataclass(frozen=True)
class DraftShape:
    """What one iteration drafts; static (part of a captured graph's key).

    ``num_steps`` autoregressive draft steps (0: none, plain decoding), ``topk`` branches per step
    (1: a chain), ``num_draft_tokens`` verified nodes per request, node 0 (the last token) included."""

    num_steps: int
    topk: int = 1
    num_draft_tokens: int | None = None  # None: a chain's num_steps + 1

    @property
    def num_nodes(self) -> int:
        return self.num_steps + 1 if self.num_draft_tokens is None else self.num_draft_tokens

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def label(self) -> str:
        """ "none", "chain K" or "tree K x topk, N nodes" (report keys)."""
        if self.num_steps == 0:
            return "none"
        return (
            f"chain {self.num_steps}"
            if self.is_chain
            else f"tree {self.num_steps} x {self.topk}, {self.num_nodes} nodes"
        )


def draft_shapes(spec) -> tuple[DraftShape, ...]:
    """The draft shapes a ``SpeculativeConfig`` allows, fewest drafts first (then fewest branches): its own
    shape when fixed; adaptive, every chain length from 0 up to ``num_steps``, and for a tree also the trees
    of its depth and node count with fewer branches per step (topk halved down to 2, as far as their
    candidates still fill the nodes): a narrower, deeper-reaching tree can accept more per verify than a
    wide one at the same cost, and a chain can beat any tree at a large batch."""
    full = DraftShape(spec.num_steps, spec.topk, spec.num_draft_tokens if spec.topk > 1 else None)
    if not spec.adaptive:
        return (full,)
    chains = tuple(DraftShape(k) for k in range(spec.num_steps + 1))
    if spec.topk == 1:
        return chains
    trees, topk = [full], spec.topk // 2
    while topk >= 2 and 1 + topk + (spec.num_steps - 1) * topk * topk >= spec.num_draft_tokens:
        trees.append(DraftShape(spec.num_steps, topk, spec.num_draft_tokens))
        topk //= 2
    return tuple(
        sorted(chains + tuple(trees), key=lambda s: (s.num_nodes, s.topk))
    )  # the most nodes last


@dataclass
class DecodeRows:
    """The requests of one decode iteration, one row each; padded rows of a captured batch use the
    padding row (length 0, greedy, its KV in the padding block). Device tensors."""

    req_indices: torch.Tensor  # [b] int64: each row\'s request (engine/request_table.py)
    lengths: torch.Tensor  # [b] int64: L, KV rows; the last token sits at position L (no KV yet)
    last_tokens: torch.Tensor  # [b] int64
    tables: torch.Tensor  # [b, max_blocks] int64 block tables
    seeds: torch.Tensor  # [b] int64 random streams
    sampling: SamplingTensors  # [b] rows
    block_size: int
    # no request of the batch holds pending rows from held steps: a drafter that holds runs its forward over
    # the narrow window (``PendingRows.narrow``) rather than the whole (engine/step_key.py ``StepKey.narrow``)
    narrow_window: bool = False

    @property
    def size(self) -> int:
        return self.req_indices.shape[0]

    def keys(self, offset: int, purpose: int) -> torch.Tensor:
        """[b] random keys for a draw deciding the token at position L + offset (outpace/request.py
        names the purposes)."""
        return random_keys(self.seeds, (self.lengths + offset) * DRAWS + purpose)

    def context(
        self, starts: torch.Tensor, query_len: int, backend, custom_mask: torch.Tensor | None = None
    ):
        """A forward context in which row s's ``query_len`` new tokens are KV rows starts[s] .. starts[s] +
        query_len - 1 (``custom_mask`` [b, query_len, window] for trees, else causal)."""
        meta = uniform_paged_metadata(self.tables, starts, query_len, self.block_size, custom_mask)
        return forward_context(meta, backend)

    def cache_slots(self, kv_rows: torch.Tensor) -> torch.Tensor:
        """[b, w] KV rows of each row's request -> [b, w] their flat rows in the paged cache."""
        return (
            self.tables.gather(1, kv_rows // self.block_size) * self.block_size
            + kv_rows % self.block_size
        )


def positions(starts: torch.Tensor, n: int) -> torch.Tensor:
    """[len(starts) * n]: positions starts[s] .. starts[s] + n - 1 of each row, concatenated."""
    return (starts[:, None] + torch.arange(n, device=starts.device)).reshape(-1)


@dataclass
class Drafts:
    """Draft tokens for every row as trees of ``num_nodes`` nodes (a chain is the tree where node i's
    parent is i - 1). Node 0 is the last token, which is not a draft."""

    token_ids: torch.Tensor  # [b, num_nodes] int64 target-vocabulary ids
    parents: torch.Tensor  # [b, num_nodes] int64, -1 for node 0
    depths: torch.Tensor  # [b, num_nodes] int64, 0 for node 0
    # Chains with sampled drafts: q at each draft position, [b, num_nodes - 1, vocab]; None when the
    # drafts were chosen deterministically (greedy, top-k trees, n-gram): q is then one-hot.
    draft_probs: torch.Tensor | None = None


@dataclass
class Verified:
    """What one iteration committed, for ``Proposer.update``: row s committed the verified nodes
    ``result.accepted_path[s, :a + 1]`` (a = ``result.num_correct_drafts[s]``) at KV rows L .. L + a
    (a tree's path already moved there), and ``result.output_token_ids[s, i]`` follows row L + i."""

    rows: DecodeRows
    hidden_states: torch.Tensor  # [b * num_nodes, hidden] the verify forward's, pre-norm
    aux_hidden_states: torch.Tensor | None  # [b * num_nodes, num_aux * hidden]
    result: VerifyResult

    def committed_rows(self, width: int) -> torch.Tensor:
        """[b, width] int64: for each row, the flat index (into the verify forward's outputs) of its
        committed nodes in order, padded with its last committed node."""
        b, path = self.rows.size, self.result.accepted_path  # path: [b, depth + 1], -1 after
        path = F.pad(path, (0, width - path.shape[1]), value=-1)  # [b, width]: cut or padded
        last = path.gather(1, self.result.num_correct_drafts[:, None])  # [b, 1]
        path = torch.where(path >= 0, path, last)
        num_nodes = self.hidden_states.shape[0] // b
        return path + torch.arange(b, device=path.device)[:, None] * num_nodes

    def next_tokens(self, width: int) -> torch.Tensor:
        """[b, width] int64: the token after each committed row, padded with the last (the bonus)."""
        out = self.result.output_token_ids  # [b, depth + 1], -1 after
        out = F.pad(out, (0, width - out.shape[1]), value=-1)  # [b, width]: cut or padded
        return torch.where(out >= 0, out, self.result.bonus_token_ids[:, None])


@dataclass
class PrefillRows:
    """Rows a prefill chunk committed, one group per request (host lists, device tensors)."""

    req_indices: list[int]
    starts: list[int]  # each request's first row in this chunk
    counts: list[int]  # its rows in this chunk
    final: list[
        bool
    ]  # whether the request decodes after this chunk (its last row's next token is its last token)
    rows: torch.Tensor  # [total] int64 index of each committed row into the forward's outputs
    token_ids: torch.Tensor  # [total] int64 the token at each row (the forward's input)
    next_token_ids: torch.Tensor  # [total] int64 the token after each row
    # [len(req_indices), absorb_reach] int64: the tokens after each chunk's last next token, as far as its
    # request's tokens go (0 past them): MTP's later layers read them
    ahead_token_ids: torch.Tensor
    hidden_states: torch.Tensor  # [num_rows_in_forward, hidden]
    aux_hidden_states: torch.Tensor | None
    tables: list[list[int]]  # each request's block table
    # each request's tokens at rows 0 .. starts[i] - 1 when this is its first chunk and those rows came
    # from the prefix cache (cache/prefix_cache.py), else []: their KV, the target's and the drafter's, is final
    reused_token_ids: list[list[int]]
    num_tokens: list[
        int
    ]  # each request's tokens the host holds (the prompt, and a recomputed one's outputs)

    @property
    def last_rows(self) -> list[int]:
        """Each chunk's last row among the committed rows (``rows``, ``token_ids``, ...)."""
        return [end - 1 for end in itertools.accumulate(self.counts)]


# Rows a pending window holds past a verify's committed rows: zero-draft steps held between two forwards.
# More make flushes rarer, but the forward after held steps runs over all of them (a flush's, or a drafting
# step's before any request's window is narrow again).
HOLD_ROWS = 8


class Window(NamedTuple):
    """A batch's pending windows as a draft reads them (``PendingRows.window``)."""

    hidden: torch.Tensor  # [b * width, hidden] each row's state
    tokens: torch.Tensor  # [b, width] int64 the token after each row
    start: torch.Tensor  # [b] int64 the first pending row's position
    count: torch.Tensor  # [b] int64 pending rows
    positions: torch.Tensor  # [b * width] int64 start + 0 .. width - 1
    last: torch.Tensor  # [b] int64 the flat row of each window's last pending row
    live: torch.Tensor  # [b * width] bool: pending rows (the rest: padding nothing reads)


class PendingRows:
    """Each request row's pending window (``Proposer`` docstring, holding): the committed rows the drafter
    has not run its forward over yet, rows start .. start + count - 1 of the request, each with the state
    the drafter reads for it and the token after it; the rest of the ``width`` columns is padding."""

    def __init__(
        self,
        indices: int,
        width: int,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
        narrow: int | None = None,
    ) -> None:
        self.width = width
        # the leading columns that hold every pending row while no held step's row is pending (the kept rows
        # and a verify's committed ones): what a draft reads where the step says so (``window``)
        self.narrow = width if narrow is None else narrow
        self.hidden = torch.zeros(indices, width, hidden, dtype=dtype, device=device)
        self.tokens = torch.zeros(
            indices, width, dtype=torch.int64, device=device
        )  # token after each
        self.start = torch.zeros(indices, dtype=torch.int64, device=device)  # first pending row
        self.count = torch.ones(indices, dtype=torch.int64, device=device)  # pending rows, >= 1

    def tensors(self) -> list[torch.Tensor]:
        return [self.hidden, self.tokens, self.start, self.count]

    def columns(self, narrow: bool) -> int:
        """The window's columns a draft reads: the narrow ones, or all."""
        return self.narrow if narrow else self.width

    def window(self, req_indices: torch.Tensor, narrow: bool = False) -> Window:
        """The batch's windows (``req_indices`` [b]) as a draft reads them, over ``columns(narrow)`` columns
        (narrow: the caller knows no row is pending past them). On the GPU one Triton launch
        (speculative/pending_window_kernel.py)."""
        w = self.columns(narrow)
        if self.hidden.is_cuda:
            from outpace.speculative import pending_window_kernel

            return Window(*pending_window_kernel.window(*self.tensors(), req_indices, w))
        b = req_indices.shape[0]
        # (the clamp: the padding row, which every padded row of a batch appends to, may count more)
        start, count = self.start[req_indices], self.count[req_indices].clamp(max=w)  # [b]
        return Window(
            self.hidden[req_indices, :w].reshape(b * w, -1),
            self.tokens[req_indices, :w],
            start,
            count,
            positions(start, w),
            torch.arange(b, device=count.device) * w + count - 1,
            (torch.arange(w, device=count.device) < count[:, None]).reshape(-1),
        )

    @staticmethod
    def layer_tokens(window: Window, drafts: list[torch.Tensor], k: int) -> torch.Tensor:
        """The tokens [b * W] an MTP layer k reads over ``window`` (speculative/drafters/mtp.py: row t reads token
        t + k + 1 of [pending tokens, drafts]; rows past the drafts read the last one, and with no drafts every row
        reads a pending token, the last past the window); ``drafts``: the drafts so far, each [b]. On the GPU one
        Triton launch after the drafts' stack."""
        b, w = window.tokens.shape
        if k == 0:  # (row t reads token t + 1: the pending tokens themselves)
            return window.tokens.reshape(-1)
        if len(drafts) == 1:
            stacked = drafts[0][:, None]  # [b, 1] a view: no stack's copy launched
        else:
            stacked = torch.stack(drafts, 1) if drafts else window.tokens.new_empty(b, 0)  # [b, D]
        if stacked.is_cuda:
            from outpace.speculative import pending_window_kernel

            return pending_window_kernel.layer_tokens(window.tokens, window.count, stacked, k)
        read = torch.arange(k, k + w, device=stacked.device).expand(b, w)
        ids = window.tokens.gather(1, read.clamp(max=w - 1))  # [b, w]
        if not drafts:
            return ids.reshape(-1)
        drafted = stacked.gather(1, (read - window.count[:, None]).clamp(0, len(drafts) - 1))
        return torch.where(read < window.count[:, None], ids, drafted).reshape(-1)

    def take_verified(self, verified: Verified, state: torch.Tensor, keep: int, rows: int) -> None:
        """After a verify: each request's window keeps its last min(count, ``keep``, L) pending rows (L its length
        before the verify) and takes the verify's committed rows after them, ``rows`` of them (the committed
        nodes, padded with the last), each with its node's row of ``state`` [b * nodes, hidden] (every verify
        row's drafter state) and the token after it; start becomes L - kept and count kept + a + 1. On the GPU one
        Triton launch (speculative/pending_window_kernel.py); elsewhere the torch form below, its reference."""
        r, b, w = verified.rows, verified.rows.size, self.width
        if self.hidden.is_cuda:
            from outpace.speculative.pending_window_kernel import take_verified

            res = verified.result
            take_verified(
                *self.tensors(),
                r.req_indices,
                r.lengths,
                res.num_correct_drafts,
                res.bonus_token_ids,
                res.accepted_path,
                res.output_token_ids,
                state,
                keep,
                rows,
            )
            return
        new_hidden = state.index_select(0, verified.committed_rows(rows).reshape(-1)).view(
            b, rows, -1
        )
        new_tokens = verified.next_tokens(rows)  # [b, rows]
        count = self.count[r.req_indices]  # [b]
        kept = torch.minimum(count.clamp(max=keep), r.lengths)  # [b] (padding row: 0)
        i = torch.arange(w, device=count.device).expand(b, w)  # [b, w]
        old = ((count - kept)[:, None] + i).clamp(max=w - 1)  # kept rows: the last ones
        is_old = i < kept[:, None]
        new = (i - kept[:, None]).clamp(0, rows - 1)
        old_hidden, old_tokens = self.hidden[r.req_indices], self.tokens[r.req_indices]
        expand = (b, w, old_hidden.shape[-1])
        self.hidden[r.req_indices] = torch.where(
            is_old[..., None],
            old_hidden.gather(1, old[..., None].expand(expand)),
            new_hidden.gather(1, new[..., None].expand(expand)),
        )
        self.tokens[r.req_indices] = torch.where(
            is_old, old_tokens.gather(1, old), new_tokens.gather(1, new)
        )
        self.start[r.req_indices] = r.lengths - kept
        self.count[r.req_indices] = kept + verified.result.num_correct_drafts + 1

    def append(self, req_indices: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        """A held step: each row's committed row (``hidden`` [b, hidden], the token after it ``tokens`` [b])
        after its pending ones. The host keeps every request's count within the width (``HoldRule``); the
        clamps only keep the padding row, which every padded row of a batch appends to, in bounds. On the GPU
        one Triton launch (speculative/pending_window_kernel.py)."""
        if self.hidden.is_cuda:
            from outpace.speculative.pending_window_kernel import append

            append(self.hidden, self.tokens, self.count, req_indices, hidden.contiguous(), tokens)
            return
        count = self.count[req_indices]  # [b]
        column = count.clamp(max=self.width - 1)
        self.hidden[req_indices, column] = hidden
        self.tokens[req_indices, column] = tokens
        self.count[req_indices] = (count + 1).clamp(max=self.width)


class Proposer(abc.ABC):
    """A drafter. ``lookahead``: KV rows past a request's last token that drafting may write
    (the scheduler reserves them with the verify's rows)."""

    aux_layer_ids: tuple[
        int, ...
    ] = ()  # target layers whose inputs the drafter reads (ModelConfig convention)
    supports_trees: bool = False
    # Prefix caching (cache/prefix_cache.py): the drafter's KV row t is a function of tokens 0 .. t + kv_reads_ahead
    kv_reads_ahead: int = 0
    # Whether the drafter loads a draft checkpoint (SpeculativeConfig.draft), and a tensor that every such
    # checkpoint holds and a target's does not (None: any model's checkpoint may be one).
    takes_draft_checkpoint: bool = True
    draft_checkpoint_tensor: str | None = None
    # Whether its drafts read a head over the target's whole vocabulary, which a token map narrows
    # (SpeculativeConfig.token_map: speculative/hot_vocab.py)
    takes_token_map: bool = False
    # Holding (module docstring): the rows of each request's pending window, and those a forward runs over
    # where no request holds rows from held steps; 0: this drafter never holds
    hold_window: int = 0
    narrow_window: int = 0

    @classmethod
    def default_num_steps(cls, draft_dir: Path) -> int:
        """Draft steps per verify when none is asked for (adaptive drafting chooses up to this many),
        for this draft checkpoint (``SpeculativeConfig.num_steps`` None)."""
        return 5

    @classmethod
    def draft_checkpoint_problem(cls, draft_dir: Path) -> str | None:
        """Why ``draft_dir`` is plainly no draft checkpoint of this drafter, None when it may be one.
        Reads config.json's presence and the tensor names only: cheap enough to run before the target loads."""
        if not (draft_dir / "config.json").is_file():
            return "it has no config.json"
        if cls.draft_checkpoint_tensor is None:
            return None
        try:
            names = checkpoint_tensor_names(draft_dir)
        except CheckpointError as e:
            return str(e)
        if cls.draft_checkpoint_tensor in names:
            return None
        problem = (
            f"{weight_files_named(draft_dir)} has no {cls.draft_checkpoint_tensor} tensor, which "
            "every such draft holds"
        )
        if "model.embed_tokens.weight" in names:
            problem += " (it holds model.embed_tokens.weight: a target checkpoint?)"
        return problem

    def __init__(
        self, spec, pool, max_requests: int, device: str, attention_backend: str = "torch"
    ) -> None:
        self.spec, self.pool, self.device = spec, pool, torch.device(device)
        self.max_requests = max_requests  # request indices 0 .. max_requests (the last: padding)
        self.backend = get_backend(attention_backend)

    @classmethod
    def check_draft_field(cls, spec) -> None:
        """Refuse ``SpeculativeConfig.draft`` where this drafter loads no draft checkpoint (it would be ignored),
        and where it plainly is no draft checkpoint of this drafter (``draft_checkpoint_problem``): the API's
        counterpart of the CLI's checks of --draft (cli/speculative_args.py ``draft_checkpoint``), run before the
        target loads (engine/start_up.py ``check_before_loading``)."""
        if spec.draft is None:
            return
        where = f"SpeculativeConfig.draft={str(spec.draft)!r} is invalid"
        if not cls.takes_draft_checkpoint:
            raise ConfigError(
                f"{where}: method {spec.method!r} loads no draft checkpoint (leave draft None)"
            )
        if not isinstance(spec.draft, (str, os.PathLike)):
            raise ConfigError(f"{where}: must be a directory path")
        draft = Path(spec.draft)
        if not draft.is_dir():
            raise ConfigError(f"{where}: no such directory")
        checkpoint_files(
            draft
        )  # its weight files readable (CheckpointError naming the one that is not)
        problem = cls.draft_checkpoint_problem(draft)
        if problem is not None:
            raise ConfigError(
                f"{where}: it is no draft checkpoint of method {spec.method!r}: {problem}"
            )

    @property
    @abc.abstractmethod
    def lookahead(self) -> int: ...

    @abc.abstractmethod
    def absorb(self, prefill: PrefillRows) -> None:
        """Bring the draft state up to date with prefill chunks (eager)."""

    # A drafter whose absorb runs draft layers over the prompt may run them as a captured graph
    # (engine/prefill_graphs.py): ``absorb_layers`` there, then ``absorb_state`` for the rest of ``absorb``.
    captures_absorb = False

    def absorbs_captured(self, prefill: PrefillRows) -> bool:
        """Whether the captured layers may absorb these chunks: no chunk's rows read rows that the request's
        previous chunk left pending (a chain of MTP layers may leave some: speculative/drafters/mtp.py)."""
        return True

    @property
    def absorb_reach(self) -> int:
        """How many rows past a row's next token ``absorb_layers`` reads (``captures_absorb`` only)."""
        return 0

    def absorb_rows(self, prefill: PrefillRows) -> torch.Tensor | None:
        """[total, width] the target's output rows ``absorb_layers`` reads (its hidden or aux states), or None
        where it reads none (``captures_absorb`` only)."""
        return None

    def absorb_buffer(self, rows: int) -> torch.Tensor | None:
        """[rows, width] zeros: the static copy of the target's rows ``absorb_rows`` gives, or None where it
        gives none (``captures_absorb`` only)."""
        return None

    def absorb_layers(
        self,
        meta,
        token_ids: torch.Tensor,
        next_ids: torch.Tensor,
        rows: torch.Tensor | None,
    ) -> None:
        """The draft layers of ``absorb`` over a captured prefill's K padded chunks of P rows
        (``absorbs_captured``; ``meta``: uniform, causal): ``token_ids`` [n = K * P] each row's token,
        ``next_ids`` [K, P + absorb_reach] each chunk's token after each row, then its ``ahead_token_ids``,
        ``rows`` [n, width] the target's (``absorb_rows``'). Rows past a chunk's own write KV rows that the next
        draft or decode step rewrites before anything reads them, as the target's padding rows do (static
        shapes; ``captures_absorb`` only)."""
        raise NotImplementedError(f"{type(self).__name__} does not capture its absorb")

    def absorb_state(self, prefill: PrefillRows) -> None:
        """``absorb`` less what ``absorb_layers`` ran (``captures_absorb`` only)."""
        raise NotImplementedError(f"{type(self).__name__} does not capture its absorb")

    @abc.abstractmethod
    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        """Draft ``shape`` for every row; static shapes (capturable). With ``shape.num_steps`` 0 it
        still brings its state up to date and returns node 0 alone (a step that flushes)."""

    @abc.abstractmethod
    def update(self, verified: Verified) -> None:
        """Record the step's committed rows; static shapes (capturable)."""

    def hold(self, verified: Verified) -> None:
        """A held zero-draft step's update (module docstring; ``draft`` did not run): append each row's one
        committed row to its pending window; static shapes (capturable). Only where ``hold_window``."""
        raise NotImplementedError(f"{type(self).__name__} does not hold zero-draft steps")

    def pending_rows(self, shape: DraftShape) -> int:
        """At most how many rows a request has pending after a step of ``shape`` that ran the forward (the
        zero-draft shape: also after a prefill). Only where ``hold_window``."""
        raise NotImplementedError(f"{type(self).__name__} does not hold zero-draft steps")

    @property
    def unsettled_rows(self) -> int:
        """At most how many of a request's last committed rows hold draft state that a later ``draft`` or
        ``update`` may still rewrite (prefix caching publishes a block only once its rows are settled)."""
        return 0

    def prefix_caching_refusal(self) -> str | None:
        """Why this drafter cannot start a request from cached blocks (None: it can)."""
        return None

    def state(self) -> list[torch.Tensor]:
        """The per-request buffers ``draft`` and ``update`` advance (each indexed by row first): saved
        and restored around a step run ahead."""
        return []
