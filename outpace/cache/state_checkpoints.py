"""Prefix caching for hybrid targets: which recurrent-state checkpoint holds the state after which prefix.

A hybrid model's prefix is two things: the attention layers' KV rows, cached in published blocks
(cache/prefix_cache.py), and the recurrent layers' state after the prefix's last token, which no block
holds. So a request may start from cached blocks only up to a block boundary where the state was saved: a
checkpoint, one request's state copied into a checkpoint row (cache/recurrent_states.py ``save_checkpoints``)
and keyed by the prefix cache's key of the block it ends (the key covers every token before it, and the
drafter's read-ahead after it: a checkpoint is used exactly where its block is).

Checkpoints are taken at the end of prefill chunks that end on a block boundary, and the scheduler ends chunks
at two boundaries of each prompt (engine/scheduler.py ``_cut_at_checkpoint``): where its tokens leave the blocks
other requests published, and its last boundary before its last token, as vLLM aligns hybrid prefill chunks with
its state blocks; SGLang's MambaRadixCache keeps the state where a request's prefill ended, on a token-granular
tree, where blocks here need the boundary.

This index is host bookkeeping only, the same on every tensor-parallel rank (each rank's scheduler runs the
same steps). A slot goes through three states: free; pending, reserved by a scheduled chunk whose step has
not yet ended (its copy is queued after the chunk's forward); confirmed, its key then looked up by joining
requests, kept least recently used first. A step that fails leaves its pending slots unconfirmed: the next
schedule frees them (``release_pending``), so no key names a state that was never written. Within a step,
loads are queued before the forward and saves after it, so a confirmed slot evicted for a save in the same
step is read by that step's loads first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable


class StateCheckpoints:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"state checkpoints need a slot, got {num_slots}")
        self._free = list(range(num_slots - 1, -1, -1))
        self._pending: dict[int, bytes] = {}
        self._confirmed: OrderedDict[bytes, int] = OrderedDict()  # least recently used first

    def lookup(self, key: bytes) -> int | None:
        """The confirmed slot of ``key`` (None: no checkpoint ends that block)."""
        return self._confirmed.get(key)

    def use(self, key: bytes) -> int:
        """A joining request starts from ``key``'s checkpoint: its slot, now the most recently used."""
        self._confirmed.move_to_end(key)
        return self._confirmed[key]

    def reserve(self, key: bytes, published: Callable[[bytes], bool]) -> int | None:
        """A slot for a checkpoint of ``key`` about to be saved: a free one, else that of the least recently used
        confirmed key whose block is no longer ``published`` (no request can start from it), else the least
        recently used one (its key forgotten); None when ``key`` has one already (confirmed or pending) or every
        slot is pending."""
        if key in self._confirmed or key in self._pending.values():
            return None
        if self._free:
            slot = self._free.pop()
        elif self._confirmed:
            dead = next((k for k in self._confirmed if not published(k)), None)
            slot = (
                self._confirmed.pop(dead) if dead is not None else self._confirmed.popitem(False)[1]
            )
        else:
            return None
        self._pending[slot] = key
        return slot

    def confirm(self, slot: int) -> None:
        """The step that saved ``slot`` ended: its key may be looked up."""
        key = self._pending.pop(slot)
        self._confirmed[key] = slot

    def release_pending(self) -> None:
        """Free every slot still pending (their step failed before its checkpoints were confirmed)."""
        self._free.extend(self._pending)
        self._pending.clear()

    @property
    def num_confirmed(self) -> int:
        return len(self._confirmed)
