"""How tensors split over the ranks of a tensor-parallel group, and what each rank reads of a
checkpoint tensor.

Rules, as vLLM and SGLang shard the Llama family:
- attention heads split evenly; key/value heads too when there are at least as many as ranks, else
  each is replicated on size / kv_heads consecutive ranks (vLLM QKVParallelLinear: rank r holds kv
  head r // (size / kv_heads)); either way the count must divide, or ``ShardingError`` names it;
- MLP intermediate rows split evenly (must divide);
- the vocabulary is padded so that every rank holds the same number of rows, a multiple of 64
  (vLLM's DEFAULT_VOCAB_PADDING_SIZE, vocab_parallel_embedding.py); the padding rows are zeros, no
  token id reaches them and gathered logits are trimmed to the real vocabulary. With one rank
  nothing is padded: the layers are the plain ones, shaped as the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VOCAB_PADDING = 64


class ShardingError(ValueError):
    """A model dimension does not split over the tensor-parallel ranks."""


@dataclass(frozen=True)
class Shard:
    """This rank's part of a checkpoint tensor of ``full`` rows along ``dim``: rows ``start .. start +
    length``; rows past ``full`` (vocabulary padding) are zeros. ``blocks`` > 1: the rows are that many
    equal blocks packed one after another (an expert's gate rows, then its up rows) and this rank holds
    rows ``start .. start + length`` of each block, concatenated (vLLM's MergedColumnParallelLinear
    shards a packed gate/up the same way)."""

    dim: int
    start: int
    length: int
    full: int
    blocks: int = 1

    def read(self, tensor_slice, full_shape: tuple[int, ...]) -> torch.Tensor:
        """This rank's part of a tensor, from ``tensor_slice`` (anything indexable by slices with the full
        tensor's ``full_shape``: a safetensors ``get_slice`` reads only the selected bytes). The caller
        checks ``full_shape[dim] == full``."""
        if self.blocks > 1:
            block = self.full // self.blocks
            return _read_ranges(
                tensor_slice,
                full_shape,
                self.dim,
                [
                    (b * block + self.start, b * block + self.start + self.length)
                    for b in range(self.blocks)
                ],
            )
        start, end = self.start, min(self.start + self.length, full_shape[self.dim])
        pad_shape = list(full_shape)
        pad_shape[self.dim] = self.length - max(
            end - start, 0
        )  # padding rows past the checkpoint's
        if end <= start:  # a rank that holds padding rows only
            return torch.zeros(pad_shape, dtype=_dtype(tensor_slice))
        part = _read_ranges(tensor_slice, full_shape, self.dim, [(start, end)])
        if pad_shape[self.dim]:
            part = torch.cat([part, part.new_zeros(pad_shape)], dim=self.dim)
        return part


@dataclass(frozen=True)
class PackedShard:
    """This rank's rows of each of several parts packed one after another along ``dim`` (a convolution's
    q, k and v channels; Mamba2's z, x, B, C and dt rows): per part, (its rows in the checkpoint, this rank's
    first row within it, this rank's rows), the rank's rows of every part concatenated in order (vLLM's
    ``mamba_v2_sharded_weight_loader`` shards such tensors part by part)."""

    dim: int
    parts: tuple[tuple[int, int, int], ...]

    @property
    def full(self) -> int:
        return sum(rows for rows, _, _ in self.parts)

    def read(self, tensor_slice, full_shape: tuple[int, ...]) -> torch.Tensor:
        """As ``Shard.read``."""
        ranges, offset = [], 0
        for rows, first, count in self.parts:
            ranges.append((offset + first, offset + first + count))
            offset += rows
        return _read_ranges(tensor_slice, full_shape, self.dim, ranges)


def _read_ranges(
    tensor_slice, full_shape: tuple[int, ...], dim: int, ranges: list[tuple[int, int]]
) -> torch.Tensor:
    """Rows [start, end) of each range along ``dim``, concatenated."""
    index, parts = [slice(None)] * len(full_shape), []
    for start, end in ranges:
        index[dim] = slice(start, end)
        parts.append(tensor_slice[tuple(index)])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _dtype(tensor_slice) -> torch.dtype:
    """The dtype of a tensor or of a safetensors slice (read from one element of it)."""
    if isinstance(tensor_slice, torch.Tensor):
        return tensor_slice.dtype
    return tensor_slice[tuple(slice(0, 1) for _ in tensor_slice.get_shape())].dtype


def mark_shard(param: torch.nn.Parameter, shard: Shard | PackedShard | None) -> torch.nn.Parameter:
    """Record on ``param`` which part of its checkpoint tensor this rank loads (None: all of it)."""
    if shard is not None:
        param.shard = shard
    return param


def split_evenly(total: int, size: int, what: str) -> int:
    """total / size, or ShardingError naming ``what`` when it does not divide."""
    if total % size:
        raise ShardingError(
            f"{what}={total} does not split over tensor_parallel_size={size} ranks: "
            f"it must be a multiple of {size}"
        )
    return total // size


def kv_head_shard(
    num_kv_heads: int, rank: int, size: int, what: str = "num_key_value_heads"
) -> tuple[int, int]:
    """(first kv head, kv heads) this rank holds: an even split, or one head replicated on
    size / num_kv_heads consecutive ranks when there are fewer heads than ranks. (Mamba2's groups of
    heads split the same way, ``what`` naming them: vLLM MambaMixer2 replicates a group on the ranks of
    its heads.)"""
    if num_kv_heads >= size:
        per_rank = split_evenly(num_kv_heads, size, what)
        return rank * per_rank, per_rank
    if size % num_kv_heads:
        raise ShardingError(
            f"{what}={num_kv_heads} cannot be replicated over "
            f"tensor_parallel_size={size} ranks: the size must be a multiple of it"
        )
    return rank // (size // num_kv_heads), 1


def vocab_shard_rows(vocab_size: int, size: int) -> int:
    """Rows of the embedding / head each rank holds: the vocabulary itself for one rank, else
    vocab_size / size rounded up to a multiple of VOCAB_PADDING."""
    if size == 1:
        return vocab_size
    step = VOCAB_PADDING * size
    return -(-vocab_size // step) * VOCAB_PADDING
