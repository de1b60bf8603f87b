"""Exact accounting of the paged KV pool's blocks, shared between requests through the prefix cache."""

from __future__ import annotations

from outpace.cache.prefix_cache import PrefixCache


class BlockPool:
    """A pool of ``num_blocks`` blocks of ``block_size`` token slots, ids 1 .. num_blocks (block 0 is the
    padding block: the KV tensors have it, no request ever owns it, see bind_kv_cache).

    Each block is in exactly one state: empty (in ``_free``); held by one or more requests' tables (its
    ``_refs`` count them); or, with a ``prefix_cache``, idle: published there, in no table, evictable.
    ``num_free`` counts empty and idle blocks, so ``num_free + len(set of blocks in tables)`` is always
    ``num_blocks``, and ``sum(len(table))`` equals the sum of ``_refs``.
    """

    def __init__(
        self, num_blocks: int, block_size: int, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self._tables: dict[str, list[int]] = {}
        self._num_published: dict[str, int] = {}  # leading blocks of each table already published
        self._bound: list[tuple] = []  # (module, dtype, device) of every bound cache (kv_cache.py)
        self._reset(num_blocks)

    def _reset(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks, 0, -1))  # a stack: pop() gives low ids first
        self._refs = [0] * (num_blocks + 1)

    def resize(self, num_blocks: int) -> None:
        """Change the pool's size while no block is in use (the engine sizes it from memory once the models
        are built; kv_cache.rebind_kv_caches then reallocates every bound cache)."""
        if self._tables or (self.prefix_cache is not None and self.prefix_cache.num_idle):
            raise RuntimeError("the KV pool can only be resized while no block is in use")
        self._reset(num_blocks)

    @property
    def padding_block(self) -> int:
        return 0

    @property
    def num_free(self) -> int:
        return len(self._free) + (
            self.prefix_cache.num_idle if self.prefix_cache is not None else 0
        )

    @property
    def num_empty(self) -> int:
        """Blocks neither in a table nor idle in the prefix cache."""
        return len(self._free)

    def is_empty(self, block: int) -> bool:
        return block in self._free

    def num_holders(self, block: int) -> int:
        """How many tables hold the block."""
        return self._refs[block]

    @property
    def held_by(self) -> set[str]:
        """The requests that hold a table now."""
        return set(self._tables)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def try_grow(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to hold ``num_tokens`` slots if enough blocks are free; whether it holds them
        now (if not, nothing changed)."""
        table = self._tables.get(request_id)
        extra = self.blocks_needed(num_tokens) - (0 if table is None else len(table))
        if extra > 0 and extra > self.num_free:  # (num_free not summed when no block is needed)
            return False
        if table is None:
            table = self._tables[request_id] = []
        for _ in range(extra):
            block = self._free.pop() if self._free else self.prefix_cache.evict()
            self._refs[block] = 1
            table.append(block)
        return True

    def grow(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow the request's table to hold ``num_tokens`` slots; returns the table."""
        if not self.try_grow(request_id, num_tokens):
            extra = self.blocks_needed(num_tokens) - len(self.table(request_id))
            raise RuntimeError(
                f"request {request_id!r} needs {extra} more blocks, {self.num_free} are free"
            )
        return self._tables[request_id]

    def free(self, request_id: str) -> None:
        """Drop the request's table. Its published blocks no other table holds become idle, the table's last
        block the most recently used (a prefix's tail is evicted before its head)."""
        self._num_published.pop(request_id, None)
        for block in reversed(self._tables.pop(request_id, [])):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self.prefix_cache is not None and self.prefix_cache.is_published(block):
                    self.prefix_cache.park(block)
                else:
                    self._free.append(block)

    # ---- prefix caching ----------------------------------------------------------------------------
    def cached_blocks(self, request_id: str, token_ids: list[int], max_tokens: int) -> list[int]:
        """The published blocks that can start this request's table: the longest run of its first blocks,
        covering at most ``max_tokens`` tokens (none without a prefix cache)."""
        cache = self.prefix_cache
        if cache is None:
            return []
        limit = min(max_tokens, len(token_ids) - cache.reads_ahead) // self.block_size
        return cache.longest_hit(cache.keys(request_id, token_ids, max(limit, 0)))

    def blocks_taken(self, blocks: list[int]) -> int:
        """How many of ``blocks`` would leave ``num_free`` if a table took them (the idle ones)."""
        return sum(1 for b in blocks if self.prefix_cache.is_idle(b)) if blocks else 0

    def reuse(self, request_id: str, blocks: list[int]) -> None:
        """Start the request's (empty) table with published ``blocks`` (``cached_blocks``)."""
        if self.table(request_id):
            raise RuntimeError(f"request {request_id!r} already holds blocks")
        for block in blocks:
            if self._refs[block] == 0:
                self.prefix_cache.unpark(block)
            self._refs[block] += 1
        self._tables[request_id] = list(blocks)
        self._num_published[request_id] = len(blocks)

    def publish(self, request_id: str, token_ids: list[int], num_settled: int) -> None:
        """Publish the request's full blocks whose rows are all among its first ``num_settled`` (their KV
        final for the target and the drafter) and whose keys' tokens ``token_ids`` holds."""
        cache = self.prefix_cache
        if cache is None:
            return
        done = self._num_published.get(request_id, 0)
        if num_settled < (done + 1) * self.block_size:  # no new full block settled (most steps)
            return
        table = self.table(request_id)
        n = min(
            num_settled // self.block_size,
            (len(token_ids) - cache.reads_ahead) // self.block_size,
            len(table),
        )
        if n <= done:
            return
        for block, key in zip(table[done:n], cache.keys(request_id, token_ids, n)[done:]):
            cache.publish(block, key)
        self._num_published[request_id] = n

    def forget(self, request_id: str) -> None:
        """The request is gone for good: its keys are dropped (its blocks stay published)."""
        if self.prefix_cache is not None:
            self.prefix_cache.forget(request_id)
