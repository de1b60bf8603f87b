"""A projection whose weight stays quantized in memory: ``QuantizedLinear``, one class for every format,
each format a small method object (``FORMATS``) that names its checkpoint tensors, makes them and computes
with them.

Weight-only on the CPU: the forward dequantizes the weight (layers/quant/dequantize.py) to the activations'
dtype and projects; activations stay in high precision. On CUDA the forward calls the GPU kernels of
layers/quant/fp8_linear_kernel.py and int4_linear_kernel.py (imported when first used; where they are absent
it dequantizes as on the CPU).

Tensor parallelism: a ``QuantizedLinear`` keeps the ``group``/``reduces``/``partial`` of the projection it
replaces, and its tensors the same part of the checkpoint tensors: a scale shards with the rows or columns it
covers (``scale_shard``), and a split that cuts a scale's block is refused naming the layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from outpace.distributed.group import SINGLE, RankGroup
from outpace.distributed.sharding import PackedShard, Shard, ShardingError, mark_shard
from outpace.layers.linear import parallel_output, project
from outpace.layers.quant import dequantize as dq
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.int4_weight import Int4Weight
from outpace.layers.quant.scheme import (
    FP8_BLOCK,
    FP8_CHANNEL,
    FP8_TENSOR,
    FP8_TENSOR_NAMES,
    INT4_GROUP,
    QuantScheme,
)

# the dtypes a checkpoint stores quantization scales in (each scale parameter's ``checkpoint_dtypes``)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class QuantFormat:
    """How one format stores a [out, in] weight: the checkpoint names of its tensors (relative to the
    module), their shapes, and the math. Subclasses: one per format."""

    weight_name: str  # the stored weight's tensor name
    scale_name: str

    def __init__(self, scheme: QuantScheme) -> None:
        self.scheme = scheme

    def weight_shape(self, out_features: int, in_features: int) -> tuple[int, ...]:
        raise NotImplementedError

    def weight_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def scale_shape(self, out_features: int, in_features: int) -> tuple[int, ...]:
        raise NotImplementedError

    def scale_factors(self) -> tuple[int | None, int | None] | None:
        """(rows, columns) of the weight each scale entry covers (None: all of that dimension); None: one scale
        for the tensor."""
        raise NotImplementedError

    def weight_column_factor(self) -> int:
        """Input columns per stored weight column (8 for packed INT4)."""
        return 1

    def dequantize(self, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cuda_linear(
        self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        """x [M, in] -> [M, out] on the GPU kernels."""
        raise NotImplementedError


class Fp8Format(QuantFormat):
    """What the FP8 formats share: ``weight`` float8_e4m3fn [out, in] and its scale, beside a static activation
    scale where the format has one (loaded, not applied: the products are weight-only), under the names the
    scheme gives (``QuantScheme.tensor_names``: compressed-tensors', or those per-tensor checkpoints store) or
    the format's own (``default_names``)."""

    weight_name = "weight"
    default_names: tuple[
        str, str | None
    ]  # (the weight scale's name, the activation scale's or None)

    def __init__(self, scheme: QuantScheme) -> None:
        super().__init__(scheme)
        self.scale_name, self.input_scale_name = scheme.tensor_names or self.default_names

    def weight_shape(self, out_features, in_features):
        return (out_features, in_features)

    def weight_dtype(self):
        return dq.FP8_DTYPE


class Fp8Block(Fp8Format):
    """Scale [ceil(out/bn), ceil(in/bk)] (fp32 or bf16): ``weight_scale_inv`` (compressed-tensors:
    ``weight_scale``)."""

    default_names = ("weight_scale_inv", None)

    def scale_shape(self, out_features, in_features):
        bn, bk = self.scheme.block
        return (math.ceil(out_features / bn), math.ceil(in_features / bk))

    def scale_factors(self):
        return self.scheme.block

    def dequantize(self, weight, scale):
        return dq.dequantize_fp8_block(weight, scale, self.scheme.block)

    def cuda_linear(self, x, weight, scale):
        from outpace.layers.quant.fp8_linear_kernel import fp8_block_linear

        return fp8_block_linear(x, weight, scale, self.scheme.block)


class Fp8Tensor(Fp8Format):
    """One float32 scale (ModelOpt stores it as [] or [1]) beside the static activation scale (scheme.py
    ``FP8_TENSOR_NAMES``: ModelOpt's ``weight_scale`` / ``input_scale``, or transformers' ``weight_scale_inv`` /
    ``activation_scale``)."""

    default_names = FP8_TENSOR_NAMES

    def scale_shape(self, out_features, in_features):
        return ()

    def scale_factors(self):
        return None

    def dequantize(self, weight, scale):
        return dq.dequantize_fp8_tensor(weight, scale)

    def cuda_linear(self, x, weight, scale):
        from outpace.layers.quant.fp8_linear_kernel import fp8_tensor_linear

        return fp8_tensor_linear(x, weight, scale)


class Fp8Channel(Fp8Format):
    """``weight_scale`` [out, 1] (fp32 or bf16), one scale an output row (compressed-tensors' channel strategy),
    beside an optional static ``input_scale``. The GPU kernels read it as block FP8 of one row by a power of two
    of columns (``Fp8Weight.per_channel``), the grouped-expert kernels too (layers/quant/experts.py)."""

    default_names = FP8_TENSOR_NAMES

    def scale_shape(self, out_features, in_features):
        return (out_features, 1)

    def scale_factors(self):
        return (1, None)

    def dequantize(self, weight, scale):
        return dq.dequantize_fp8_channel(weight, scale)

    def cuda_linear(self, x, weight, scale):
        return Fp8Weight.per_channel(weight, scale).project(x)


class Int4Group(QuantFormat):
    """``weight_packed`` int32 [out, in/8], ``weight_scale`` [out, in/group] (bf16 in Kimi's files)."""

    weight_name, scale_name = "weight_packed", "weight_scale"

    def weight_shape(self, out_features, in_features):
        return (out_features, in_features // dq.INT4_PACK_FACTOR)

    def weight_dtype(self):
        return torch.int32

    def scale_shape(self, out_features, in_features):
        return (out_features, in_features // self.scheme.group)

    def scale_factors(self):
        return (1, self.scheme.group)

    def weight_column_factor(self):
        return dq.INT4_PACK_FACTOR

    def dequantize(self, weight, scale):
        return dq.dequantize_int4_group(weight, scale, self.scheme.group)

    def cuda_linear(self, x, weight, scale):
        from outpace.layers.quant.int4_linear_kernel import int4_group_linear

        return int4_group_linear(x, weight, scale, self.scheme.group)


FORMATS: dict[str, type[QuantFormat]] = {
    FP8_BLOCK: Fp8Block,
    FP8_TENSOR: Fp8Tensor,
    FP8_CHANNEL: Fp8Channel,
    INT4_GROUP: Int4Group,
}


class QuantizedLinear(nn.Module):
    """x [..., in_features] -> [..., out_features] with the weight stored quantized (module docstring).

    Tensors, under the checkpoint's names: the format's weight (``weight`` fp8 or ``weight_packed`` int32)
    and scale (``weight_scale_inv`` / ``weight_scale``, in the checkpoint's dtype); ``bias`` when the
    projection has one; per-tensor FP8's static activation scale (loaded, not applied: the products are
    weight-only) and compressed-tensors' ``weight_shape`` (the unpacked [out, in], checked after loading) as
    buffers."""

    group: RankGroup = SINGLE
    reduces: bool = False
    partial: bool = False

    def __init__(
        self,
        fmt: QuantFormat,
        in_features: int,
        out_features: int,
        bias: bool,
        scale_dtype: torch.dtype,
        device: torch.device | None = None,
        scale_shape: tuple[int, ...] | None = None,
    ) -> None:
        """``scale_shape``: the scale's, where the format allows another than its own (a per-tensor scale
        stored [1] rather than [])."""
        super().__init__()
        self.format, self.in_features, self.out_features = fmt, in_features, out_features
        stored = torch.empty(
            fmt.weight_shape(out_features, in_features), dtype=fmt.weight_dtype(), device=device
        )
        weight = nn.Parameter(stored, requires_grad=False)
        weight.checkpoint_dtypes = (fmt.weight_dtype(),)
        self.register_parameter(fmt.weight_name, weight)
        scale = nn.Parameter(
            torch.empty(
                scale_shape or fmt.scale_shape(out_features, in_features),
                dtype=scale_dtype,
                device=device,
            ),
            requires_grad=False,
        )
        scale.checkpoint_dtypes = SCALE_DTYPES
        self.register_parameter(fmt.scale_name, scale)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device))
        if getattr(fmt, "input_scale_name", None):
            self.register_buffer(fmt.input_scale_name, torch.ones((), device=device))
        # the scales, each value checked not negative at load (checkpoint.py ``scale_names``)
        self.checkpoint_scales = (fmt.scale_name,) + (
            (fmt.input_scale_name,) if getattr(fmt, "input_scale_name", None) else ()
        )
        if isinstance(fmt, Int4Group):
            self.register_buffer("weight_shape", torch.zeros(2, dtype=torch.int32, device=device))

    @property
    def stored_weight(self) -> torch.Tensor:
        return getattr(self, self.format.weight_name)

    @property
    def scale(self) -> torch.Tensor:
        return getattr(self, self.format.scale_name)

    def dequantized(self) -> torch.Tensor:
        """The weight as float32 [out_features, in_features]."""
        return self.format.dequantize(self.stored_weight, self.scale)

    def kernel_weight(self) -> Fp8Weight | Int4Weight:
        """The stored weight and its scales as one value, as the fused few-row projections read them."""
        if isinstance(self.format, Int4Group):
            return Int4Weight(self.stored_weight, self.scale, self.format.scheme.group)
        if isinstance(self.format, Fp8Block):
            return Fp8Weight(self.stored_weight, self.scale, tuple(self.format.scheme.block))
        if isinstance(self.format, Fp8Channel):
            return Fp8Weight.per_channel(self.stored_weight, self.scale)
        if isinstance(self.format, Fp8Tensor):
            return Fp8Weight.per_tensor(self.stored_weight, self.scale)
        raise TypeError(f"no kernel weight for {type(self.format).__name__}")

    def extra_repr(self) -> str:
        return f"{type(self.format).__name__}, in_features={self.in_features}, out_features={self.out_features}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As layers/linear.py ``Linear.forward`` (``parallel_output``), over the quantized product."""
        return parallel_output(self, x, self._project)

    def _project(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out]: the GPU kernels read the stored weight; the CPU dequantizes it."""
        if not x.is_cuda:
            return project(x, self.dequantized().to(x.dtype), bias)
        rows = x.reshape(-1, x.shape[-1])  # [M, in]
        out = self.format.cuda_linear(rows, self.stored_weight, self.scale)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if bias is None else out + bias


def is_quantized(module: nn.Module | None) -> bool:
    """Whether a projection's weight is stored quantized, so a kernel that reads ``weight`` as a plain
    half-precision matrix cannot serve it (the fused few-row paths decline it, as they do a shard)."""
    return isinstance(module, QuantizedLinear)


def quantized_like(
    linear: nn.Linear,
    fmt: QuantFormat,
    scale_dtype: torch.dtype,
    name: str,
    device: str | torch.device | None = None,
    scale_shape: tuple[int, ...] | None = None,
) -> QuantizedLinear:
    """A ``QuantizedLinear`` in place of ``linear`` (same features, bias, tensor-parallel group and part of
    the checkpoint tensors) on ``device`` (default: linear's, which may be the meta device of a model built
    without its parameters); ``name`` (the checkpoint's module name) names it in a sharding error;
    ``scale_shape``: ``QuantizedLinear``'s."""
    device = linear.weight.device if device is None else device
    layer = QuantizedLinear(
        fmt, linear.in_features, linear.out_features, linear.bias is not None, scale_dtype, device,
        scale_shape,
    )  # fmt: skip
    for attr in ("group", "reduces", "partial"):
        if attr in vars(linear):
            setattr(layer, attr, getattr(linear, attr))
    shard = getattr(linear.weight, "shard", None)
    if shard is not None:
        mark_shard(
            layer.stored_weight, scale_shard(shard, (1, fmt.weight_column_factor()), name, "weight")
        )
        factors = fmt.scale_factors()
        if factors is not None and factors[shard.dim] is not None:  # (else whole on every rank)
            mark_shard(layer.scale, scale_shard(shard, factors, name, "scale"))
    if linear.bias is not None and getattr(linear.bias, "shard", None) is not None:
        mark_shard(layer.bias, linear.bias.shard)
    return layer


def scale_shard(shard: Shard | PackedShard, factors: tuple[int, int], layer: str, what: str):
    """This rank's part of a tensor that has one entry per ``factors`` (rows, columns) of the weight whose
    part is ``shard``: the same rows or columns, divided by the factor along the split dimension. A split
    that starts or ends inside one entry's block (other than at the tensor's end) is refused, naming
    ``layer``: the rank would need a scale it shares with its neighbour."""
    factor = factors[shard.dim]
    if factor == 1:
        return shard

    def divided(start: int, length: int, full: int) -> tuple[int, int, int]:
        if start % factor or (length % factor and start + length != full):
            raise ShardingError(
                f"{layer}: the tensor-parallel split of its {what} (rows {start}..{start + length} of "
                f"{full} along dim {shard.dim}) cuts a quantization block of {factor}: choose a "
                f"tensor_parallel_size whose parts are multiples of {factor}"
            )
        return start // factor, math.ceil(length / factor), math.ceil(full / factor)

    if isinstance(shard, PackedShard):
        parts = []
        for rows, first, count in shard.parts:
            first_q, count_q, rows_q = divided(first, count, rows)
            parts.append((rows_q, first_q, count_q))
        return PackedShard(shard.dim, tuple(parts))
    if shard.blocks > 1:
        block = shard.full // shard.blocks
        divided(0, block, shard.full)  # each packed block must itself be whole blocks
        divided(shard.start, shard.length, block)
    start, length, full = divided(shard.start, shard.length, shard.full)
    return Shard(shard.dim, start, length, full, shard.blocks)
