"""Many tensor-to-tensor copies in one launch (Triton; CUDA, and Triton's interpreter on the CPU for tests): what
a step run ahead saves of its rows' request state (engine/run_ahead.py ``save_plan``: each state buffer's runs of
rows, a hybrid's recurrent states MBs a row), copied as 32-bit words.

``torch._foreach_copy_`` did it before, one launch per dtype: on the H200 the Qwen3-Next slice's decode step at
batch 1 began with four of them, 29 us for 12 MB of float32 states and a few small tensors, 78 us at batch 8
(benchmarks/results/gpu_2026-12-01e calls 1 and 2's step timelines): its programs take a bounded number of
chunks each, too few programs for a few large tensors. Here every program copies one block of ``BLOCK`` words
of one piece, the pieces' blocks laid end to end on the grid, so the copy spreads over the whole GPU whatever
the pieces' sizes.

A piece is (source, target, words): two contiguous regions of the same layout, 4-byte aligned and a whole
number of words (``CopyPieces.takes``; the caller copies others with torch). Their
addresses are taken when the plan is made and read by the kernel from device tensors, so the launch is the
same for every step of one plan; the plan must not outlive the tensors (run_ahead.py keeps each plan with
its tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK = 4096  # 32-bit words a program copies (16 KB)


@triton.jit
def _copy_pieces_kernel(
    src_ptrs,  # [pieces] int64: each piece's source address
    dst_ptrs,  # [pieces] int64: its target's
    words_ptr,  # [pieces] int64: its length in 32-bit words
    block_starts,  # [pieces] int32: its first program (ascending; program 0 the first piece's)
    num_pieces,
    BLOCK: tl.constexpr,
    BLOCK_P: tl.constexpr,  # a power of two >= num_pieces
):
    """Program b: block b - block_starts[p] of the piece p whose blocks hold b."""
    pid = tl.program_id(0)
    pieces = tl.arange(0, BLOCK_P)
    starts = tl.load(block_starts + pieces, mask=pieces < num_pieces, other=2**31 - 1)
    piece = tl.sum((starts <= pid).to(tl.int32), axis=0) - 1
    src = tl.load(src_ptrs + piece).to(tl.pointer_type(tl.int32))
    dst = tl.load(dst_ptrs + piece).to(tl.pointer_type(tl.int32))
    words = tl.load(words_ptr + piece)
    offs = (pid - tl.load(block_starts + piece)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < words
    tl.store(dst + offs, tl.load(src + offs, mask=ok), mask=ok)


@dataclass(frozen=True)
class CopyPieces:
    """A fixed set of copies, made once (``of``) and launched any number of times (``__call__``)."""

    src_ptrs: torch.Tensor  # [pieces] int64
    dst_ptrs: torch.Tensor
    words: torch.Tensor  # [pieces] int64
    block_starts: torch.Tensor  # [pieces] int32
    blocks: int  # the grid

    @staticmethod
    def takes(target: torch.Tensor, source: torch.Tensor) -> bool:
        """Whether a copy source -> target can be a piece: the same shape and dtype, both contiguous, whole
        4-byte aligned 32-bit words."""
        return (
            target.shape == source.shape
            and target.dtype == source.dtype
            and (source.numel() * source.element_size()) % 4 == 0
            and all(t.is_contiguous() and t.data_ptr() % 4 == 0 for t in (target, source))
        )

    @classmethod
    def of(cls, targets: list[torch.Tensor], sources: list[torch.Tensor]) -> CopyPieces | None:
        """The copies source -> target of each pair (each one ``takes``; the caller copies others itself),
        None for no bytes at all."""
        pieces = []
        for target, source in zip(targets, sources, strict=True):
            if not cls.takes(target, source):
                raise ValueError(
                    f"a copy of {tuple(source.shape)} {source.dtype} into {tuple(target.shape)} "
                    f"{target.dtype} is not one of whole, aligned 32-bit words of one layout"
                )
            if source.numel():
                words = source.numel() * source.element_size() // 4
                pieces.append((source.data_ptr(), target.data_ptr(), words))
        if not pieces:
            return None
        device = targets[0].device
        blocks = [triton.cdiv(words, BLOCK) for _, _, words in pieces]
        starts = [sum(blocks[:i]) for i in range(len(blocks))]
        src, dst, words = zip(*pieces)
        as_int64 = dict(dtype=torch.int64, device=device)
        return cls(
            torch.tensor(src, **as_int64),
            torch.tensor(dst, **as_int64),
            torch.tensor(words, **as_int64),
            torch.tensor(starts, dtype=torch.int32, device=device),
            sum(blocks),
        )

    def __call__(self) -> None:
        """Every copy, in one launch."""
        pieces = self.words.shape[0]
        _copy_pieces_kernel[(self.blocks,)](
            self.src_ptrs,
            self.dst_ptrs,
            self.words,
            self.block_starts,
            pieces,
            BLOCK=BLOCK,
            BLOCK_P=triton.next_power_of_2(pieces),
        )
