"""An INT4 weight as the fused few-row projections read it (layers/fused_projection.py), the twin of fp8_weight.py's
``Fp8Weight``: compressed-tensors' packed nibbles and their group scales as one value, so that a packed projection
(layers/decoder.py ``PackedProjection``) or a fused layer (layers/fused_decoder.py ``fused_weight``) hands it on
where it would hand on a half-precision weight, and the quantized product (layers/quant/quant_matmul_kernel.py,
format "int4_group") reads it. No Triton here: the CPU builds and dequantizes it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from outpace.layers.quant import dequantize as dq


@dataclass(frozen=True)
class Int4Weight:
    """``weight`` int32 [N, K / 8] (eight 4-bit values a word, contiguous rows) and ``scale`` [N, K / group], one
    value per ``group`` columns of a row (Gemma 4 QAT's and Kimi-K2-Thinking's ``weight_packed`` and
    ``weight_scale``: layers/quant/dequantize.py ``dequantize_int4_group`` has the layout). A row's scales are its
    own, so any rows pack or split."""

    weight: torch.Tensor  # [N, K / 8] int32
    scale: torch.Tensor  # [N, K / group]
    group: int

    format = "int4_group"  # quant_matmul's name of the layout

    @property
    def scale_block(self) -> tuple[int, int]:
        """The (rows, columns) one scale covers, as quant_matmul takes it."""
        return (1, self.group)

    @classmethod
    def packed(cls, parts: list[Int4Weight]) -> Int4Weight:
        """The parts' rows one after another (a packed q/k/v or gate/up), their scales likewise: all of one group
        and one scale dtype."""
        first = parts[0]
        if any(p.group != first.group or p.scale.dtype != first.scale.dtype for p in parts):
            raise ValueError("packed INT4 weights share one group and one scale dtype")
        return cls(
            torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]), first.group
        )

    @property
    def shape(self) -> torch.Size:
        """[N, K]: the real weight's."""
        return torch.Size((self.weight.shape[0], self.weight.shape[1] * dq.INT4_PACK_FACTOR))

    def rows(self, start: int, stop: int | None = None) -> Int4Weight:
        """Rows start .. stop of the weight (views)."""
        return Int4Weight(self.weight[start:stop], self.scale[start:stop], self.group)

    def dequantized(self) -> torch.Tensor:
        """The real weight, float32 [N, K]."""
        return dq.dequantize_int4_group(self.weight, self.scale, self.group)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] @ the real weight.T -> [..., N] in x's dtype: the GPU's INT4 kernels
        (layers/quant/int4_linear_kernel.py), the dequantized weight on the CPU."""
        if x.is_cuda:
            from outpace.layers.quant.int4_linear_kernel import int4_group_linear  # (Triton)

            return int4_group_linear(x, self.weight, self.scale, self.group)
        return torch.nn.functional.linear(x, self.dequantized().to(x.dtype))
