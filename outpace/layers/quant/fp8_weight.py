"""An fp8 weight as the fused few-row projections read it (layers/fused_projection.py): the stored fp8 matrix and
its scales as one value, so that a kernel, a packed projection (layers/decoder.py ``PackedProjection``) or a
fused layer (layers/fused_decoder.py ``fused_weight``) hands it on where it would hand on a half-precision
weight. No Triton here: the CPU builds and dequantizes it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from outpace.layers.quant import dequantize as dq


@dataclass(frozen=True)
class Fp8Weight:
    """``weight`` float8_e4m3fn [N, K] (contiguous rows) and ``scale`` (float32 or bf16), one value per
    ``block`` = (rows, columns) of the weight: block FP8's ``weight_scale_inv`` [ceil(N / bn), ceil(K / bk)]
    (DeepSeek-V3's weight_dequant multiplies by it), a per-tensor scale (ModelOpt) as a [1, 1] view of
    one block at least as large as the weight (``per_tensor``), or a scale a row (``per_channel``)."""

    weight: torch.Tensor  # [N, K] fp8
    scale: torch.Tensor  # [ceil(N / block[0]), ceil(K / block[1])]
    block: tuple[int, int]

    format = "fp8_block"  # quant_matmul's name of the layout (a per-tensor or per-channel scale: one block)

    @property
    def scale_block(self) -> tuple[int, int]:
        """The (rows, columns) one scale covers, as quant_matmul takes it."""
        return self.block

    @classmethod
    def per_tensor(cls, weight: torch.Tensor, scale: torch.Tensor) -> Fp8Weight:
        """A weight with one scale (ModelOpt's ``weight_scale``, [] or [1]): one block of powers of two."""
        n, k = weight.shape
        return cls(weight, scale.reshape(1, 1), (_power_of_two_from(n), _power_of_two_from(k)))

    @classmethod
    def per_channel(cls, weight: torch.Tensor, scale: torch.Tensor) -> Fp8Weight:
        """A weight with one scale a row (compressed-tensors' channel strategy, [N, 1]): blocks of one row by a
        power of two of columns, at least K."""
        n, k = weight.shape
        return cls(weight, scale.reshape(n, 1), (1, cls.per_channel_block_k(k)))

    @staticmethod
    def per_channel_block_k(k: int) -> int:
        """The columns of a per-channel scale's block over K columns: a power of two, at least K and 64 (the fp8
        kernels' blocks: every K step of theirs then lies in the row's one scale column)."""
        return max(64, _power_of_two_from(k))

    @classmethod
    def packed(cls, parts: list[Fp8Weight]) -> Fp8Weight:
        """The parts' rows one after another (a packed q/k/v or gate/up), their scale rows likewise: every
        part but the last must hold whole blocks of rows, all of one block and one scale dtype."""
        block = parts[0].block
        for i, part in enumerate(parts):
            if part.block != block or part.scale.dtype != parts[0].scale.dtype:
                raise ValueError("packed fp8 weights share one block and one scale dtype")
            if i < len(parts) - 1 and part.shape[0] % block[0]:
                raise ValueError(
                    f"part {i} of a packed fp8 weight has {part.shape[0]} rows, not whole blocks of "
                    f"{block[0]}"
                )
        weight = torch.cat([p.weight for p in parts])
        return cls(weight, torch.cat([p.scale for p in parts]), block)

    @classmethod
    def packed_per_tensor(cls, parts: list[Fp8Weight]) -> Fp8Weight:
        """Per-tensor parts (``per_tensor``: one scale each, ModelOpt's) one after another as block FP8: blocks
        of their row counts' greatest common divisor by a power of two >= K columns, each block's scale its
        part's (copied into the packed scale [rows / divisor, 1]), so the block kernels read every part at its
        own scale."""
        rows = math.gcd(*(p.shape[0] for p in parts))
        scale = torch.cat([p.scale.reshape(1, 1).expand(p.shape[0] // rows, 1) for p in parts])
        weight = torch.cat([p.weight for p in parts])
        return cls(weight, scale, (rows, _power_of_two_from(weight.shape[1])))

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def rows(self, start: int, stop: int | None = None) -> Fp8Weight:
        """Rows start .. stop of the weight (views): both must begin a block or end the weight."""
        stop = self.shape[0] if stop is None else stop
        for edge in (start, stop):
            if edge % self.block[0] and edge != self.shape[0]:
                raise ValueError(f"rows {start}..{stop} cut a scale block of {self.block[0]} rows")
        first, last = start // self.block[0], -(-stop // self.block[0])
        return Fp8Weight(self.weight[start:stop], self.scale[first:last], self.block)

    def dequantized(self) -> torch.Tensor:
        """The real weight, float32 [N, K]."""
        return dq.dequantize_fp8_block(self.weight, self.scale, self.block)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] @ the real weight.T -> [..., N] in x's dtype: the GPU's fp8 kernels
        (layers/quant/fp8_linear_kernel.py), the dequantized weight on the CPU."""
        if x.is_cuda:
            from outpace.layers.quant.fp8_linear_kernel import fp8_block_linear  # (Triton)

            return fp8_block_linear(x, self.weight, self.scale, self.block)
        return torch.nn.functional.linear(x, self.dequantized().to(x.dtype))


def _power_of_two_from(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
