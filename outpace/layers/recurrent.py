"""What every layer with a per-request recurrent state shares (gated DeltaNet: layers/gated_deltanet.py,
Mamba2: layers/mamba2.py): the layout of a forward's tokens as one run per sequence, and the state it
starts from and leaves behind.

A forward's tokens are flat ([num_tokens, ...], attention metadata in the forward context); a recurrent
layer runs each sequence's tokens in order, so ``TokenRuns`` lays them out as [num_seqs, max_len] runs
(padding positions are marked invalid and leave the state unchanged).

The state of a request lives in its state row (cache/recurrent_states.py): the state after every token
whose KV is committed. The forward context's ``recurrent`` metadata (``RecurrentMetadata``) says, per
sequence, which row it reads, whether it starts from that row's state or from zeros (the first chunk
of a prompt), and what the forward keeps:
- prefill: the state after the sequence's last token goes back into its row;
- verify: the state after *every* token goes into the row's snapshot rows (row i: after token i),
  the row itself untouched; the engine then copies the snapshot at ``last_correct_step_indices``
  into the row (``RecurrentStates.commit``). With ``parents`` (a draft tree) token i continues from its
  parent's state, not from token i - 1's. A chain's verify may instead leave the state after its last
  token in the row, as a prefill does (``last_row``: that token's index, whose snapshot row then need not
  be written), where every recurrent layer of the model can (``chain_end_in_row``): the commit of a row
  that accepted every draft then copies nothing.
Without recurrent metadata (references and tests) each sequence starts from zeros and nothing is kept.

Batch-invariant mode on the CPU (attention/context.py ``batch_invariant``): a token's bits must not depend on
how many tokens share the forward, nor on whether it is decoded alone or verified in a chain. The torch
recurrences walk token by token with the same shapes at every step, and ATen's CPU reductions sum each output
in an order set by its own length and strides, not by how many outputs there are. What followed the batch
(besides the attention: attention/torch_backend.py) were elementwise kernels with a transcendental (exp,
softplus, sigmoid, silu): on a contiguous tensor they run vector code up to the last whole pair of vectors and
scalar code on the tail, the two round differently, and which elements fall in the tail follows the tensor's
size. ``rows_alone`` computes such a step token by token; the short convolution sums its window in a fixed
order (layers/causal_conv.py). tests/engine/test_batch_invariant_hybrids.py fails without either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from outpace.attention.context import batch_invariant, get_forward_context
from outpace.attention.metadata import DenseCausalMetadata


def rows_alone(fn: Callable[..., Any], *args: Any, lead: int = 1) -> Any:
    """``fn(*args)``; in batch-invariant mode on the CPU (module docstring) computed for each row alone: the
    first ``lead`` dims of every tensor argument index the rows (the same in each), other arguments pass as
    they are, and ``fn``'s result (a tensor, or a tuple of tensors) comes back with those dims in front."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not batch_invariant() or tensors[0].is_cuda:
        return fn(*args)
    rows = tensors[0].shape[:lead]
    flat = [a.flatten(0, lead - 1) if isinstance(a, torch.Tensor) else a for a in args]
    outs = [
        fn(*(a[i : i + 1] if isinstance(a, torch.Tensor) else a for a in flat))
        for i in range(rows.numel())
    ] or [fn(*flat)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts).unflatten(0, rows) for parts in zip(*outs))
    return torch.cat(outs).unflatten(0, rows)


def scan_runs(
    state: torch.Tensor,
    valid: torch.Tensor,
    parents: torch.Tensor | None,
    keep_every: bool,
    out: torch.Tensor,
    step: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch form of a recurrence over runs, one token at a time (the CPU path and the kernels'
    reference): ``step(t, s)`` takes each run's state before token t ([runs, ...] float32) and returns the
    state after it and the token's output, written into ``out[:, t]``. state [runs, ...]; valid, parents
    [runs, len] (module docstring: padding leaves the state alone; with ``parents``, token t continues from
    its parent's state). -> (the state after each run (a tree: after its last node), the state after every
    token [runs, len, ...] or None)."""
    runs, length = valid.shape
    row = torch.arange(runs, device=state.device)
    stack = None
    if parents is not None or keep_every:
        stack = state.new_empty(
            runs, length + 1, *state.shape[1:]
        )  # [:, i + 1]: the state after token i
        stack[:, 0] = state
    for t in range(length):
        s, out[:, t] = step(t, state if parents is None else stack[row, parents[:, t] + 1])
        if parents is None:
            state = torch.where(valid[:, t].view(-1, *[1] * (state.dim() - 1)), s, state)
        if stack is not None:
            stack[:, t + 1] = s
    return (state if parents is None else stack[:, -1]), (stack[:, 1:] if keep_every else None)


@dataclass
class RecurrentMetadata:
    """Per-forward facts recurrent layers read from the forward context (module docstring)."""

    state_indices: torch.Tensor  # [num_seqs] int64: each sequence's row of the recurrent state
    has_initial_state: torch.Tensor  # [num_seqs] bool: start from the row's state (else from zeros)
    # [num_seqs, max_len] int64: each token's parent among its sequence's tokens (-1: the row's state);
    # None: a chain (token i - 1)
    parents: torch.Tensor | None = None
    snapshots: bool = False  # verify: keep the state after every token in the snapshot rows
    # a chain's verify of last_row + 1 tokens a sequence that also leaves the state after its last valid token in
    # the row (module docstring); None: the row untouched
    last_row: int | None = None
    # [num_seqs] int64: the tokens of each run that advance its state, a prefix (the rest are padding); None:
    # the forward's query_lens. A captured prefill's chunks, padded to one length (engine/prefill_graphs.py).
    run_lens: torch.Tensor | None = None

    def valid_lens(self, meta) -> torch.Tensor:
        """[num_seqs] each run's valid tokens: ``run_lens``, else the paged metadata ``meta``'s query_lens."""
        return meta.query_lens if self.run_lens is None else self.run_lens

    def kernel_parents(self, token_table: torch.Tensor) -> torch.Tensor:
        """The parents a fused step kernel takes (layers/deltanet_step_kernel.py, mamba2_step_kernel.py): a
        tree's. A chain's are not read, so any tensor serves: ``token_table``, or in batch-invariant mode an
        int64 one all the same, the tree's pointer type, for the mode launches one compilation for both forms."""
        invariant = batch_invariant()
        if self.parents is None:
            return self.state_indices if invariant else token_table
        if invariant and self.parents.dtype != torch.int64:
            raise ValueError(f"a draft tree's parents are int64, got {self.parents.dtype}")
        return self.parents


@dataclass
class TokenRuns:
    """The forward's flat tokens as one run per sequence."""

    index: torch.Tensor  # [num_seqs, max_len] int64: flat index of each run position (padding: 0)
    valid: (
        torch.Tensor
    )  # [num_seqs, max_len] bool: a real token (padding leaves the state as it is)
    seq_index: torch.Tensor  # [num_tokens] int64: each flat token's run
    query_index: torch.Tensor  # [num_tokens] int64: its position in the run

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[num_tokens, ...] -> [num_seqs, max_len, ...]."""
        return x[self.index]

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """[num_seqs, max_len, ...] -> [num_tokens, ...]."""
        return y[self.seq_index, self.query_index]

    @classmethod
    def of_context(cls, device: torch.device) -> TokenRuns:
        """The runs of the current forward's tokens (on ``device``, the tokens')."""
        meta = get_forward_context().metadata
        if isinstance(meta, DenseCausalMetadata):
            b, t = meta.batch_size, meta.seq_len
            flat = torch.arange(b * t, device=device)
            return cls(
                flat.view(b, t),
                torch.ones(b, t, dtype=torch.bool, device=device),
                flat // t,
                flat % t,
            )
        index = meta.token_table().long()
        recurrent = get_forward_context().recurrent
        lens = meta.query_lens if recurrent is None else recurrent.valid_lens(meta)  # [num_seqs]
        valid = torch.arange(meta.max_query_len, device=index.device) < lens[:, None]
        return cls(index, valid, meta.token_seq_index, meta.token_query_index)


class RecurrentStateLayer(nn.Module):
    """A layer that owns one request's recurrent state per state row: ``state_shapes`` declares the
    tensors (per row), ``bind_state`` (called by cache/recurrent_states.py) gives it the pool's tensors."""

    states: dict[str, torch.Tensor] | None = None  # name -> [table_rows, ...]
    snapshots: dict[str, torch.Tensor] | None = None  # name -> [table_rows, max_verify_rows, ...]
    # whether every path of the layer honours RecurrentMetadata.last_row (module docstring)
    chain_end_in_row: bool = True

    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        """name -> (per-request shape, dtype; None: the model's dtype)."""
        raise NotImplementedError

    def bind_state(
        self, states: dict[str, torch.Tensor], snapshots: dict[str, torch.Tensor]
    ) -> None:
        self.states, self.snapshots = states, snapshots

    def initial_states(self, runs: TokenRuns, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> [num_seqs, ...] the state each run starts from: its row's, or zeros (a state declared
        without a dtype takes x's, the layer's input)."""
        recurrent = get_forward_context().recurrent
        num_seqs = runs.index.shape[0]
        out = {}
        for name, (shape, dtype) in self.state_shapes().items():
            zeros = torch.zeros(num_seqs, *shape, dtype=dtype or x.dtype, device=x.device)
            if recurrent is None or self.states is None:
                out[name] = zeros
            else:
                start = recurrent.has_initial_state.view(-1, *[1] * len(shape))
                out[name] = torch.where(
                    start, self.states[name].index_select(0, recurrent.state_indices), zeros
                )
        return out

    def parents(self) -> torch.Tensor | None:
        """[num_seqs, max_len] each token's parent in its run (a tree's verify), or None (a chain)."""
        recurrent = get_forward_context().recurrent
        return None if recurrent is None else recurrent.parents

    def keeps_every_state(self) -> bool:
        """Whether this forward keeps the state after every token (verify) rather than the last."""
        recurrent = get_forward_context().recurrent
        return recurrent is not None and recurrent.snapshots and self.states is not None

    def store(self, final: dict[str, torch.Tensor], every: dict[str, torch.Tensor] | None) -> None:
        """Keep what this forward computed (module docstring): ``final`` name -> [num_seqs, ...] the state
        after each run's last token; ``every`` name -> [num_seqs, max_len, ...] after each token (verify)."""
        recurrent = get_forward_context().recurrent
        if recurrent is None or self.states is None:
            return
        for name, state in self.states.items():
            if recurrent.snapshots:
                rows = every[name].shape[1]
                self.snapshots[name][recurrent.state_indices, :rows] = every[name].to(state.dtype)
            if not recurrent.snapshots or recurrent.last_row is not None:
                state.index_copy_(0, recurrent.state_indices, final[name].to(state.dtype))
