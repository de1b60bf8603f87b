"""Recurrent state memory of hybrid models (gated DeltaNet, Mamba2: layers/recurrent.py), beside the paged
KV pool.

Every running request holds one state row: per recurrent layer, its tensors (the convolution window and
the float32 SSM / delta-rule state) at one row of that layer's pool. A state row is the request's
request row (engine/request_table.py): it is taken when the request is admitted and returned on finish, abort
and preemption with it, and a preempted request recomputes its state from its tokens (its first prefill
chunk starts from zeros, ``has_initial_state`` False); the last row is the padding rows'. Beside each
row, ``max_verify_rows`` snapshot rows: a verify forward writes the state after each of its tokens there
(row i: after node i), and ``commit`` then copies the row at ``last_correct_step_indices`` into the row,
so the state is again the one after every committed token (the SGLang seed review: the accepted step's
state, not the next one's; for a tree the accepted node's, computed from its parent's). A chain's verify
leaves the state after its last node in the row itself where every recurrent layer can
(layers/recurrent.py ``RecurrentMetadata.last_row``), so a row that accepted every draft commits without a
copy: on the widened Qwen3.5 the commit of a batch-1 verify copies 49 MiB (25 us on the H200),
and MTP accepts both its drafts about half the time.

Memory: ``bytes_per_request`` (states and their snapshot rows) times the indices, fixed at start-up like the
KV pool (outpace sizes both from the configuration: ``num_kv_blocks``, ``max_num_seqs`` and the largest
draft tree; ``nbytes`` is the whole).

With prefix caching, ``allocate_checkpoints`` adds checkpoint rows: a state per row, no snapshots, which
``save_checkpoints`` fills from request rows after a prefill chunk and ``load_checkpoints`` copies into a joining
request's row before its first chunk (which rows hold which prefix: cache/state_checkpoints.py).
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.host_copies import to_device
from outpace.layers.recurrent import RecurrentMetadata, RecurrentStateLayer


class RecurrentStates:
    def __init__(
        self,
        model: nn.Module,
        num_slots: int,
        max_verify_rows: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        """Allocate and bind the state of every ``RecurrentStateLayer`` of ``model``: per state tensor,
        [num_slots, ...] and its snapshots [num_slots, max_verify_rows, ...] (dtype: as the layer
        declares, else ``dtype``)."""
        self.device = torch.device(device)
        self.max_verify_rows = max_verify_rows
        self.layers = [m for m in model.modules() if isinstance(m, RecurrentStateLayer)]
        self.chain_end_in_row = all(layer.chain_end_in_row for layer in self.layers)
        self._states: list[torch.Tensor] = []
        self._snapshots: list[torch.Tensor] = []
        self._checkpoints: list[torch.Tensor] = []  # per state tensor, [num_checkpoints, ...]
        for layer in self.layers:
            states, snapshots = {}, {}
            for name, (shape, declared) in layer.state_shapes().items():
                kind = dict(dtype=declared or dtype, device=self.device)
                states[name] = torch.zeros(num_slots, *shape, **kind)
                snapshots[name] = torch.zeros(num_slots, max_verify_rows, *shape, **kind)
                self._states.append(states[name])
                self._snapshots.append(snapshots[name])
            layer.bind_state(states, snapshots)
        # on CUDA, ``commit`` in one launch for every tensor (cache/state_commit_kernel.py)
        self._commit_kernel = None
        if self._states and self.device.type == "cuda":
            from outpace.cache.state_commit_kernel import StateCommit  # Triton: only with a GPU

            self._commit_kernel = StateCommit(self._states, self._snapshots)

    @property
    def has_state(self) -> bool:
        """Whether the model has any recurrent layer (else every method here is a no-op)."""
        return bool(self.layers)

    @property
    def bytes_per_request(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self._states + self._snapshots)

    @property
    def state_bytes_per_request(self) -> int:
        """A request's states without their snapshot rows."""
        return sum(t[0].numel() * t.element_size() for t in self._states)

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in self._states + self._snapshots + self._checkpoints
        )

    def allocate_checkpoints(self, num_checkpoints: int) -> None:
        """Rows for ``num_checkpoints`` saved states (each a request's states without snapshots), zeroed."""
        self._checkpoints = [
            torch.zeros(num_checkpoints, *t.shape[1:], dtype=t.dtype, device=self.device)
            for t in self._states
        ]

    def save_checkpoints(self, indices: list[int], slots: list[int]) -> None:
        """Checkpoint row slots[i] becomes the state of request row indices[i] (queued after the forward that
        computed it)."""
        self._copy_rows(self._states, indices, self._checkpoints, slots)

    def load_checkpoints(self, indices: list[int], slots: list[int]) -> None:
        """Request row indices[i] starts from checkpoint row slots[i] (queued before its first chunk)."""
        self._copy_rows(self._checkpoints, slots, self._states, indices)

    def _copy_rows(
        self,
        sources: list[torch.Tensor],
        from_rows: list[int],
        targets: list[torch.Tensor],
        to_rows: list[int],
    ) -> None:
        if not from_rows:
            return
        src, dst = to_device(from_rows, self.device), to_device(to_rows, self.device)
        for source, target in zip(sources, targets):
            target.index_copy_(0, dst, source.index_select(0, src))

    def tensors(self) -> list[torch.Tensor]:
        """Every per-request state tensor ([table_rows, ...]) a step advances (the snapshots are scratch rows
        within one step)."""
        return list(self._states)

    def prefill(self, indices: list[int], starts: list[int]) -> RecurrentMetadata | None:
        """Prefill chunks of the requests in these indices, starting at KV rows ``starts``: each continues
        its row's state (from zeros at row 0) and leaves its state after its last token there."""
        if not self.has_state:
            return None
        return RecurrentMetadata(
            torch.tensor(indices, dtype=torch.int64, device=self.device),
            torch.tensor([s > 0 for s in starts], device=self.device),
        )

    def padded_prefill(
        self, indices: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor
    ) -> RecurrentMetadata | None:
        """``prefill`` of chunks padded to one length (device tensors [num_seqs], capturable: a captured prefill,
        engine/prefill_graphs.py): chunk s's first ``lens[s]`` tokens advance its row's state, its padding leaves
        it as it is."""
        if not self.has_state:
            return None
        return RecurrentMetadata(indices, starts > 0, run_lens=lens)

    def decode(self, indices: torch.Tensor, lengths: torch.Tensor) -> RecurrentMetadata | None:
        """A step of one token per row (plain decoding; device tensors, capturable): indices, lengths [b].
        Each row's state advances in place, as a prefill chunk's does: the state after the token is the only
        one there is to keep, so no snapshots are written and nothing is committed after it."""
        if not self.has_state:
            return None
        return RecurrentMetadata(indices, lengths > 0)

    def verify(
        self,
        indices: torch.Tensor,
        lengths: torch.Tensor,
        parents: torch.Tensor | None,
        chain_nodes: int | None = None,
    ) -> RecurrentMetadata | None:
        """A verify forward over draft trees (device tensors, capturable): indices, lengths [b]; parents
        [b, num_nodes] (-1 for node 0) or None for chains. Writes snapshots, and given ``chain_nodes`` (a chain
        of that many tokens a row) where every layer can, the state after each row's last token into the row
        (module docstring); pass the result to ``commit``."""
        if not self.has_state:
            return None
        if parents is not None and parents.shape[1] > self.max_verify_rows:
            raise ValueError(
                f"{parents.shape[1]} verified nodes, the state snapshots hold {self.max_verify_rows}"
            )
        in_row = parents is None and chain_nodes is not None and self.chain_end_in_row
        last_row = chain_nodes - 1 if in_row else None
        return RecurrentMetadata(indices, lengths > 0, parents, snapshots=True, last_row=last_row)

    def commit(
        self,
        indices: torch.Tensor,
        rows: torch.Tensor,
        verified: RecurrentMetadata | None = None,
    ) -> None:
        """After a verify: row indices[i]'s state becomes its snapshot row rows[i] (``last_correct_step_indices``),
        device operations only (capturable). indices, rows [b] int64; ``verified``: the verify's metadata,
        whose ``last_row`` (when set) the rows already hold, so those are not copied."""
        held = -1 if verified is None or verified.last_row is None else verified.last_row
        if self._commit_kernel is not None:
            self._commit_kernel(indices, rows, held)
            return
        for state, snapshots in zip(self._states, self._snapshots):
            kept = (rows == held).view(-1, *[1] * (state.dim() - 1))
            state.index_copy_(
                0, indices, torch.where(kept, state[indices], snapshots[indices, rows])
            )
