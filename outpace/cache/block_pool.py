"""Exact accounting of the paged KV pool's blocks."""
from __future__ import annotations


class BlockPool:
    """A fixed pool of ``num_blocks`` blocks of ``block_size`` token slots.

    Invariant: every block is either in ``free`` or owned by exactly one request's table, so
    ``num_free + sum(len(table))`` is always ``num_blocks``.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() gives low ids first
        self._tables: dict[str, list[int]] = {}

    @property
    def padding_block(self) -> int:
        """A block id past the pool's own: the KV tensors have it, no request ever owns it (see bind_kv_cache)."""
        return self.num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def can_hold(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request's table can grow to hold ``num_tokens`` slots."""
        return self.blocks_needed(num_tokens) - len(self.table(request_id)) <= self.num_free

    def grow(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow the request's table to hold ``num_tokens`` slots; returns the table."""
        table = self._tables.setdefault(request_id, [])
        extra = self.blocks_needed(num_tokens) - len(table)
        if extra > self.num_free:
            raise RuntimeError(f"request {request_id!r} needs {extra} more blocks, {self.num_free} are free")
        for _ in range(extra):
            table.append(self._free.pop())
        return table

    def free(self, request_id: str) -> None:
        self._free.extend(reversed(self._tables.pop(request_id, [])))
