"""Automatic prefix caching: which KV blocks hold which token prefix, for reuse across requests.

A full block is published under a key once every row in it is settled, for the target and for the
drafter (``BlockPool.publish``); a new request whose first blocks' keys are published starts with
those blocks in its table and computes only the rest (``BlockPool.reuse``). Published blocks no table
holds stay in the pool as idle, evicted least recently used first when the pool needs a block.

Keys. The target's KV row t is a function of tokens 0 .. t, but a drafter's may read further: EAGLE3's
draft row t reads token t + 1, MTP layer k's row t token t + k + 1 (speculative/*.py: each proposer's
``kv_reads_ahead``). So block b (rows bB .. bB + B - 1) is keyed by every token its rows read: a chained
sha256 over the blocks 0 .. b, then over the ``reads_ahead`` tokens after the block. Two requests
share a block only when the target's and the drafter's rows in it were computed from the same tokens,
so a hit leaves every proposal as it would have been (SGLang keyed the draft's rows as the target's,
and lost most hits on deep prompts to mismatches: sglang#32459). The cost is that a prefix must match
``reads_ahead`` tokens past a block for that block to hit.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counted in tokens over requests admitted (a preempted request counts again when readmitted)."""

    queries: int = 0  # tokens of admitted requests that a hit could have covered
    hits: int = 0  # of those, tokens whose KV came from the cache

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCache:
    """Keys of a request's full blocks, the block published under each key, and the idle ones (published,
    in no table) in least-recently-used order. The pool (block_pool.py) owns the blocks themselves."""

    def __init__(self, block_size: int, reads_ahead: int = 0) -> None:
        self.block_size = block_size
        self.reads_ahead = reads_ahead
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # least recently used first
        # request -> (chained digests of its blocks' tokens, their keys), for its first blocks so far
        self._chains: dict[str, tuple[list[bytes], list[bytes]]] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def is_idle(self, block: int) -> bool:
        return block in self._idle

    def keys(self, request_id: str, token_ids: list[int], num_blocks: int) -> list[bytes]:
        """The keys of the request's first ``num_blocks`` blocks (block b needs tokens up to (b + 1) *
        block_size + reads_ahead - 1). Kept per request until ``forget``: its tokens only ever grow."""
        bs, ahead = self.block_size, self.reads_ahead
        if num_blocks > 0 and num_blocks * bs + ahead > len(token_ids):
            raise ValueError(
                f"block {num_blocks - 1} of request {request_id!r} reads tokens up to "
                f"{num_blocks * bs + ahead - 1}, the request has {len(token_ids)}"
            )
        chain, keys = self._chains.setdefault(request_id, ([], []))
        for b in range(len(keys), num_blocks):
            parent = chain[-1] if chain else b""
            chain.append(
                hashlib.sha256(
                    parent + array("q", token_ids[b * bs : (b + 1) * bs]).tobytes()
                ).digest()
            )
            after = token_ids[(b + 1) * bs : (b + 1) * bs + ahead]
            keys.append(
                hashlib.sha256(chain[b] + array("q", after).tobytes()).digest()
                if ahead
                else chain[b]
            )
        return keys[:num_blocks]

    def longest_hit(self, keys: list[bytes]) -> list[int]:
        """The published blocks of the longest run of ``keys`` from the first."""
        blocks = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def publish(self, block: int, key: bytes) -> None:
        """Publish ``block`` (held by a table) under ``key``, unless the key already has a block (two requests
        computed the same prefix at once: the second keeps its block unpublished) or the block a key."""
        if key not in self._block_of and block not in self._key_of:
            self._block_of[key] = block
            self._key_of[block] = key

    def is_published(self, block: int) -> bool:
        return block in self._key_of

    def has_key(self, key: bytes) -> bool:
        """Whether a block is published under ``key``."""
        return key in self._block_of

    def park(self, block: int) -> None:
        """A published block left its last table: idle, the most recently used."""
        self._idle[block] = None

    def unpark(self, block: int) -> None:
        """An idle block joins a table again."""
        del self._idle[block]

    def evict(self) -> int:
        """The least recently used idle block, unpublished."""
        block, _ = self._idle.popitem(last=False)
        del self._block_of[self._key_of.pop(block)]
        return block

    def forget(self, request_id: str) -> None:
        self._chains.pop(request_id, None)
