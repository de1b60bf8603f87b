"""Routed experts stored quantized, and the stacked layout the GPU grouped kernels read.

Per-expert checkpoints (DeepSeek-V3/R1, Kimi-K2 FP8 and Kimi-K2-Thinking INT4, Qwen3-Next-FP8, Nemotron-H
ModelOpt FP8: ``mlp.experts.{e}.{gate,up,down}_proj`` each with its own scale) load as one ``QuantizedLinear``
per projection of each expert's MLP module (layers/quant/loading.py). layers/moe.py ``RoutedExperts`` runs
them eagerly on the CPU (``run_experts``: each projection dequantizes) and, on CUDA, on the grouped kernels of
layers/quant/moe_quant_kernels.py (``run_quantized_experts``: no host synchronisation, so a quantized MoE
step can be captured in a CUDA graph) over ``QuantizedExpertStacks``:
- block FP8: gate_up float8_e4m3fn [E, 2 * I, H] (each expert's gate rows, then its up rows) with scale_inv
  [E, ceil(2I/bn), ceil(H/bk)], down [E, H, I] with [E, ceil(H/bn), ceil(I/bk)] (I a multiple of bn, so that
  gate and up do not share a block: true of every published layout, 128 | 2048, 1536, 512);
- INT4 groups: gate_up int32 [E, 2 * I, H / 8] with scale [E, 2 * I, H / group], down [E, H, I / 8] with
  [E, H, I / group] (compressed-tensors packing: dequantize.py);
- per-tensor FP8 (ModelOpt): gate_up [E, 2 * I, H], down [E, H, I] with one scale per expert and projection,
  gate_up [E, 2] (gate, up) and down [E]; the kernels read them as block FP8 of blocks (I, 128), the
  per-tensor scale repeated over the blocks of its projection by a stride-0 view (the same products: w * s
  in float32; nothing copied);
- per-channel FP8 (compressed-tensors, e.g. Qwen3-30B-A3B-FP8-dynamic): gate_up [E, 2 * I, H] with scale
  [E, 2 * I, 1], down [E, H, I] with [E, H, 1]; read as block FP8 of one row by a power of two of columns at
  least max(H, I), so every K step lies in a row's one scale column. A shared MLP in this format runs beside the
  experts where it is wider than one (down's scale a row serves every slot's columns).
Ungated experts (Nemotron-H's relu2) stack their up projections alone as ``gate_up``.

Checkpoints that store the experts stacked in block FP8 (Step-3.5-Flash-FP8: ``moe.{gate,up,down}_proj``
fp8 [E, out, in] with ``weight_scale_inv`` [E, ceil(out/bn), ceil(in/bk)]) load as ``QuantizedStackedWeight``
in place of the bf16 ``StackedWeight``: the kernels read those stacks in place (``run_quantized_stacks``).
Other stacked formats are refused by name (layers/quant/loading.py); Qwen3.5's MoE FP8 checkpoints were not
found in the public references checked, so no other stacked layout is implemented but transformers' fused FP8
experts in per-tensor FP8 (``quantize_packed_stacks``: ``mlp.experts.gate_up_proj`` float8 [E, 2I, H] beside
``gate_up_proj_scale_inv``, one scale an expert, the layout a third party's read of Mistral Small 4's FP8 release
reports), which the kernels read in place as the per-tensor stacks above (``QuantizedExpertStacks.of_packed``).

The stacks are made once, on first use, and every expert's tensors become views of them (as layers/moe.py
``RoutedExperts.stacks`` does for half-precision experts): no memory is added, and a checkpoint reload in
place reaches the kernels. They are made again when a tensor has been given other storage since.

A shared MLP quantized as the experts are and S experts wide (DeepSeek-V3's, Kimi-K2's, Qwen3-Next's one
shared expert; DeepSeek-V2-Lite's two, one MLP of 2 x 1408 rows; ``quantized_shared_stacks``) runs in the
grouped kernels as every token's S shared slots (layers/moe_kernels.py's shared experts fusion), as a
half-precision one does (layers/moe.py ``shared_expert_stacks``): its stored weights and its scales are
passed as strided views of its own tensors (``slot_views``), nothing copied or stacked. Each projection
splits at the routed experts' width: gate and up [S * I, .] -> [S, I, .], down [H, S * I] -> [S, H, I] of
strides (I, S * I, 1), and their scales alike, which asks that no scale block straddle two slots: block FP8
I a multiple of both block sides (V2-Lite: 1408 = 11 x 128) unless S is 1, INT4 I a multiple of the group
(and of the 8 nibbles a word packs). Per-tensor FP8 follows the same route, its one scale a projection
repeated over the S slots (a stride-0 view) and read as blocks as the routed experts' are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from outpace.layers.quant.dequantize import INT4_PACK_FACTOR
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.int4_weight import Int4Weight
from outpace.layers.quant.linear import (
    SCALE_DTYPES,
    Fp8Block,
    Fp8Channel,
    Fp8Tensor,
    Int4Group,
    QuantFormat,
    QuantizedLinear,
)

_KERNEL_SCALE_DTYPES = (torch.float32, torch.bfloat16)  # what moe_quant_kernels.py reads
_TENSOR_BLOCK_K = 128  # per-tensor FP8 read as blocks of (I, 128): a K step the fp8 kernels take


def has_quantized_experts(experts: nn.Module) -> bool:
    """Whether a ``RoutedExperts``' per-expert modules hold quantized projections."""
    per_expert = getattr(experts, "per_expert", None)
    return bool(per_expert) and isinstance(
        getattr(per_expert[0], "down_proj", None), QuantizedLinear
    )


def _projections(module: nn.Module, gated: bool) -> tuple[QuantizedLinear, ...]:
    """(gate, up, down) of a gated expert, (up, down) of an ungated one."""
    names = ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
    return tuple(getattr(module, name) for name in names)


def grouped_kernels_take(experts: nn.Module) -> bool:
    """Whether the quantized grouped kernels can run these quantized experts (the checks of
    moe_quant_kernels.py): every projection quantized alike, the scales in float32 or bf16, and block FP8 of
    power-of-two column blocks >= 64 with I a multiple of the row block when gated (per-expert modules,
    stacked into one gate/up tensor), INT4 groups of a power of two that divide H and I. Else they run
    eagerly (``run_experts``)."""
    gated = experts.activation.gated
    if packed_format(experts) is not None:  # (per-tensor FP8, read as blocks)
        scales = [getattr(experts, n + PACKED_SCALE) for n in ("gate_up_proj", "down_proj")]
        return all(s.dtype in _KERNEL_SCALE_DTYPES for s in scales)
    if has_quantized_stacks(experts):  # (gate and up read apart: no common block needed)
        block_k = experts.down_proj.format.scheme.block[1]
        scales = [experts.up_proj, experts.down_proj] + ([experts.gate_proj] if gated else [])
        return (
            block_k >= 64
            and not block_k & (block_k - 1)
            and all(s.weight_scale_inv.dtype in _KERNEL_SCALE_DTYPES for s in scales)
        )
    first = _projections(experts.per_expert[0], gated)
    if not all(isinstance(p, QuantizedLinear) for p in first):
        return False
    fmt = first[-1].format
    if any(type(p.format) is not type(fmt) for p in first) or any(
        p.scale.dtype not in _KERNEL_SCALE_DTYPES for p in first
    ):
        return False
    hidden, inter = first[-1].out_features, first[-1].in_features
    if isinstance(fmt, Fp8Block):
        block_n, block_k = fmt.scheme.block
        return block_k >= 64 and not block_k & (block_k - 1) and not (gated and inter % block_n)
    if isinstance(fmt, Fp8Channel):  # (read as blocks of one row: ``QuantizedExpertStacks.run``)
        return True
    if isinstance(fmt, Int4Group):
        group = fmt.scheme.group
        return not group & (group - 1) and not hidden % group and not inter % group
    return isinstance(fmt, Fp8Tensor)


def slot_views(
    ins: list[torch.Tensor], down: torch.Tensor, slots: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A shared MLP's tensors (weights or scales, contiguous) of ``slots`` experts' width as that many
    experts, views of their own storage: each input projection's [slots * rows, cols] -> [slots, rows, cols],
    down's [rows, slots * cols] -> [slots, rows, cols] of strides (cols, slots * cols, 1)."""
    rows, width = down.shape
    split_ins = [t.view(slots, t.shape[0] // slots, t.shape[1]) for t in ins]
    return split_ins, down.view(rows, slots, width // slots).transpose(0, 1)


@dataclass(frozen=True)
class QuantizedShared:
    """A quantized shared MLP as ``count`` more experts of the routed experts' width (module docstring):
    views of its own stored weights and scales, each slot of one routed expert's shapes."""

    # gate (None: ungated) and up [S, I, H] (INT4: [S, I, H / 8]), down [S, H, I] ([S, H, I / 8])
    weights: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]
    # their scales as the routed stacks hold one expert's: block FP8 [S, ceil(I/bn), ceil(H/bk)] and [S,
    # ceil(H/bn), I/bk], INT4 [S, I, H/group] and [S, H, I/group], per-tensor [S] (one scale repeated)
    scales: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]

    @property
    def count(self) -> int:
        """Shared slots per token."""
        return self.weights[1].shape[0]


def _splits_into_slots(fmt, inter: int, slots: int) -> bool:
    """Whether a projection ``slots`` experts of ``inter`` wide splits into slots without a scale block or a
    packed word across two of them (module docstring)."""
    if slots == 1 or isinstance(fmt, Fp8Tensor):
        return True
    if isinstance(
        fmt, Fp8Channel
    ):  # (down's one scale a row serves every slot's columns: not as slots)
        return False
    if isinstance(fmt, Fp8Block):
        return not any(inter % side for side in fmt.scheme.block)
    return not inter % fmt.scheme.group and not inter % INT4_PACK_FACTOR


def quantized_shared_stacks(mlp: nn.Module | None, experts: nn.Module) -> QuantizedShared | None:
    """``mlp`` as shared slots of the quantized grouped kernels over ``experts`` (module docstring): the
    experts per-expert modules they take (``grouped_kernels_take``), the MLP gated alike with each projection
    quantized in the experts' format and scheme, scales of their dtype, no bias, stored contiguous, a width a
    whole number of experts' that splits into slots (``_splits_into_slots``), the experts' activation
    without a clamp; else None (it runs beside them)."""
    if mlp is None or not has_quantized_experts(experts) or not grouped_kernels_take(experts):
        return None
    gated, activation = experts.activation.gated, experts.activation
    names = ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
    if any(not isinstance(getattr(mlp, n, None), QuantizedLinear) for n in names):
        return None
    mine, theirs = _projections(mlp, gated), _projections(experts.per_expert[0], gated)
    hidden, inter = theirs[-1].out_features, theirs[-1].in_features
    width = mine[-1].in_features
    slots = width // inter
    alike = all(
        type(a.format) is type(b.format)
        and a.format.scheme == b.format.scheme
        and a.scale.dtype == b.scale.dtype
        and a.bias is None
        and a.stored_weight.is_contiguous()
        and a.scale.is_contiguous()
        for a, b in zip(mine, theirs)
    )
    shapes = (
        slots
        and width == slots * inter
        and mine[-1].out_features == hidden
        and all(p.out_features == width and p.in_features == hidden for p in mine[:-1])
    )
    same_act = getattr(mlp, "act", None) == activation.name and activation.limit is None
    fmt = theirs[-1].format
    if not (alike and shapes and same_act and getattr(mlp, "limit", None) is None) or (
        not _splits_into_slots(fmt, inter, slots)
    ):
        return None
    *ins, down = mine
    weights_in, weight_down = slot_views([p.stored_weight for p in ins], down.stored_weight, slots)
    if isinstance(fmt, Fp8Tensor):  # (one scale a projection, each slot's the same)
        scales_in = [p.scale.reshape(1).expand(slots) for p in ins]
        scale_down = down.scale.reshape(1).expand(slots)
    else:
        scales_in, scale_down = slot_views([p.scale for p in ins], down.scale, slots)
    weights = (weights_in[0] if gated else None, weights_in[-1], weight_down)
    scales = (scales_in[0] if gated else None, scales_in[-1], scale_down)
    return QuantizedShared(weights, scales)


@dataclass(eq=False)  # (tensors: compared by identity)
class QuantizedExpertStacks:
    """The stacks of the module docstring: gate/up and down in their format with their scales."""

    format: QuantFormat
    gated: bool
    gate_up: torch.Tensor  # [E, 2I (I ungated), H] (INT4: H / 8 int32 words)
    gate_up_scale: torch.Tensor  # the format's scales of gate_up (per-tensor FP8: [E, 2] or [E, 1])
    down: torch.Tensor  # [E, H, I]
    down_scale: torch.Tensor  # (per-tensor FP8: [E])

    @classmethod
    def of_modules(cls, per_expert: list[nn.Module], gated: bool) -> QuantizedExpertStacks:
        """Per-expert modules' projections stacked, their tensors then made views of the stacks."""
        rows = [_projections(m, gated) for m in per_expert]
        fmt = rows[0][-1].format
        # Plain tensors even inside inference mode: the parameters become views of them.
        with torch.no_grad(), torch.inference_mode(False):
            gate_up = torch.stack([torch.cat([p.stored_weight for p in r[:-1]]) for r in rows])
            down = torch.stack([r[-1].stored_weight for r in rows])
            if isinstance(fmt, Fp8Tensor):  # [E, 2] (gate, up) or [E, 1], and [E]
                scales = [torch.stack([p.scale.reshape(()) for p in r[:-1]]) for r in rows]
                gate_up_scale = torch.stack(scales)
                down_scale = torch.stack([r[-1].scale.reshape(()) for r in rows])
            else:
                gate_up_scale = torch.stack([torch.cat([p.scale for p in r[:-1]]) for r in rows])
                down_scale = torch.stack([r[-1].scale for r in rows])
            stacks = cls(fmt, gated, gate_up, gate_up_scale, down, down_scale)
            for e, (module, r) in enumerate(zip(per_expert, rows)):
                stacks._view(r, e)
                stacks._view_packed(module, e)
        return stacks

    @classmethod
    def of_packed(cls, experts: nn.Module) -> QuantizedExpertStacks:
        """The stacks of ``quantize_packed_stacks``' experts, read in place: their gate/up and down, each
        expert's one scale a projection as gate's and up's ([E, 2], a stride-0 view) and down's ([E])."""
        gate_up_scale = getattr(experts, "gate_up_proj" + PACKED_SCALE).reshape(-1, 1).expand(-1, 2)
        down_scale = getattr(experts, "down_proj" + PACKED_SCALE).reshape(-1)
        return cls(
            experts.packed_format,
            True,
            experts.gate_up_proj,
            gate_up_scale,
            experts.down_proj,
            down_scale,
        )

    def _view(self, projections: tuple[QuantizedLinear, ...], e: int) -> None:
        """Expert ``e``'s tensors as views of the stacks (their rows of gate_up, its down)."""
        *ins, down = projections
        row = scale_row = 0
        for i, p in enumerate(ins):
            rows = p.stored_weight.shape[0]
            p.stored_weight.data = self.gate_up[e, row : row + rows]
            if isinstance(self.format, Fp8Tensor):
                p.scale.data = self.gate_up_scale[e, i].view(p.scale.shape)
            else:
                scale_rows = p.scale.shape[0]
                p.scale.data = self.gate_up_scale[e, scale_row : scale_row + scale_rows]
                scale_row += scale_rows
            row += rows
        down.stored_weight.data = self.down[e]
        down.scale.data = self.down_scale[e].view(down.scale.shape)

    def _view_packed(self, module: nn.Module, e: int) -> None:
        """Expert ``e``'s packed gate/up (layers/decoder.py ``PackedProjection`` over block FP8 or INT4, whose
        rows are gate's then up's, as the stack's, and so are their scales' rows), where it has one, made a view of
        the stacks too: it held the storage the gate and up weights viewed, which stayed beside the stacks. That
        doubled the experts' gate/up bytes: the whole Qwen3-Next-80B in block FP8 with its MTP layer no longer fit
        one H200 (137 GiB at the first captured step, benchmarks/results/gpu_2026-12-01 calls 3 and 4)."""
        packed = getattr(module, "gate_up", None)
        if packed is not None and isinstance(packed.weight, (Fp8Weight, Int4Weight)):
            packed.weight = replace(
                packed.weight, weight=self.gate_up[e], scale=self.gate_up_scale[e]
            )

    def current(self, per_expert: list[nn.Module]) -> bool:
        """Whether these are the stacks of these experts, their tensors still the views made here."""
        first = _projections(per_expert[0], self.gated)
        return (
            first[0].stored_weight.data_ptr() == self.gate_up.data_ptr()
            and first[-1].stored_weight.data_ptr() == self.down.data_ptr()
        )

    def run(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        activation: str,
        limit: float | None,
        layout=None,
        skipped_slots: bool = False,
        shared: QuantizedShared | None = None,
        ready: tuple[torch.Tensor, torch.Tensor, float] | None = None,
        row_scale: torch.Tensor | None = None,
    ):
        """moe_quant_kernels.py's grouped experts over the stacks: x [n, H], weights [n, top_k] float32 (or
        [n, top_k + S] with the shared slots'), ids [n, top_k] -> [n, H] in x's dtype, the output of
        ``shared``'s slots included (``quantized_shared_stacks``); ``ready`` and ``row_scale``: the fused
        residual stack's (layers/grouped_experts.py: then ``NormedRows``)."""
        from outpace.layers.quant import moe_quant_kernels as kernels  # Triton: CUDA installs only

        common = dict(
            activation=activation,
            limit=limit,
            gated=self.gated,
            layout=layout,
            skipped_slots=skipped_slots,
            shared=shared,
            ready=ready,
            row_scale=row_scale,
        )
        if isinstance(self.format, Int4Group):
            return kernels.int4_group_grouped_experts(
                x, weights, ids, self.gate_up, self.gate_up_scale, self.down, self.down_scale,
                group=self.format.scheme.group, **common,
            )  # fmt: skip
        if isinstance(self.format, Fp8Block):
            block, gate_up_scale, down_scale = (
                self.format.scheme.block,
                self.gate_up_scale,
                self.down_scale,
            )
        elif isinstance(
            self.format, Fp8Channel
        ):  # scales [E, rows, 1]: blocks of one row by every column
            _, hidden, inter = self.down.shape
            block = (1, Fp8Weight.per_channel_block_k(max(hidden, inter)))
            gate_up_scale, down_scale = self.gate_up_scale, self.down_scale
        else:  # per-tensor FP8 read as blocks (module docstring), the shared slots' too
            block = (self.down.shape[2], _TENSOR_BLOCK_K)
            gate_up_scale = self.tensor_input_blocks(self.gate_up_scale)
            down_scale = self.tensor_down_blocks(self.down_scale)
            if shared is not None:
                gate, up, down = shared.scales
                as_blocks = (
                    None if gate is None else self.tensor_input_blocks(gate),
                    self.tensor_input_blocks(up),
                    self.tensor_down_blocks(down),
                )
                common["shared"] = replace(shared, scales=as_blocks)
        return kernels.fp8_block_grouped_experts(
            x, weights, ids, self.gate_up, gate_up_scale, self.down, down_scale, block=block, **common
        )  # fmt: skip

    # Per-tensor FP8 scales read as block FP8 of blocks (I, 128) (module docstring): stride-0 views, each
    # scale repeated over its projection's blocks (nothing copied: a scale reloaded in place reaches them).

    def tensor_input_blocks(self, scale: torch.Tensor) -> torch.Tensor:
        """Gate and up scales [E, P] (P projections) or [E] (one) -> [E, P or 1, ceil(H/128)]."""
        hidden = self.down.shape[1]
        return scale.reshape(scale.shape[0], -1, 1).expand(
            -1, -1, math.ceil(hidden / _TENSOR_BLOCK_K)
        )

    def tensor_down_blocks(self, scale: torch.Tensor) -> torch.Tensor:
        """Down scales [E] -> [E, ceil(H/I), ceil(I/128)]."""
        _, hidden, inter = self.down.shape
        return scale.reshape(-1, 1, 1).expand(
            -1, math.ceil(hidden / inter), math.ceil(inter / _TENSOR_BLOCK_K)
        )


def run_quantized_experts(
    experts: nn.Module,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    layout=None,
    skipped_slots: bool = False,
    shared: QuantizedShared | None = None,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    row_scale: torch.Tensor | None = None,
):
    """A ``RoutedExperts`` of quantized per-expert modules on the grouped kernels (module docstring), with
    ``shared``'s slots (``quantized_shared_stacks``): the stacks made on first use (and again after the
    tensors moved), then one run (``ready``, ``row_scale``: ``QuantizedExpertStacks.run``'s)."""
    stacks = experts.quantized_stacks
    if stacks is None or not stacks.current(experts.per_expert):
        stacks = QuantizedExpertStacks.of_modules(experts.per_expert, experts.activation.gated)
        experts.quantized_stacks = stacks
    activation = experts.activation
    return stacks.run(
        x, weights, ids, activation.kernel, activation.limit, layout, skipped_slots, shared,
        ready, row_scale,
    )  # fmt: skip


class QuantizedStackedWeight(nn.Module):
    """One projection of every routed expert stored as one block-FP8 stack (Step-3.5-Flash-FP8's
    ``moe.{gate,up,down}_proj``): ``weight`` float8_e4m3fn [E, out, in] and ``weight_scale_inv`` [E,
    ceil(out/bn), ceil(in/bk)] (fp32 in stepfun-ai/Step-3.5-Flash-FP8: model.layers.3.moe.gate_proj is
    [288, 1280, 4096] with scales [288, 10, 32], down_proj [288, 4096, 1280] with [288, 32, 10], as read
    from its safetensors by the public reports of it). In place of layers/moe.py ``StackedWeight``, with
    its shard (the scale's the blocks of it, ``scale_shard``)."""

    def __init__(
        self,
        stacked: nn.Module,
        fmt: Fp8Block,
        scale_dtype: torch.dtype,
        name: str,
        device: str | torch.device | None = None,
    ) -> None:
        """In place of ``stacked`` (a ``StackedWeight``), on ``device`` (default: its weight's)."""
        super().__init__()
        from outpace.distributed.sharding import mark_shard
        from outpace.layers.quant.linear import scale_shard

        self.format = fmt
        experts, out_features, in_features = stacked.weight.shape
        device = stacked.weight.device if device is None else device
        self.weight = nn.Parameter(
            torch.empty(
                experts, out_features, in_features, dtype=torch.float8_e4m3fn, device=device
            ),
            requires_grad=False,
        )
        self.weight.checkpoint_dtypes = (torch.float8_e4m3fn,)
        rows, cols = fmt.scale_shape(out_features, in_features)
        self.weight_scale_inv = nn.Parameter(
            torch.empty(experts, rows, cols, dtype=scale_dtype, device=device), requires_grad=False
        )
        self.weight_scale_inv.checkpoint_dtypes = SCALE_DTYPES
        self.checkpoint_scales = ("weight_scale_inv",)  # (no value negative: checkpoint.py)
        shard = getattr(stacked.weight, "shard", None)
        if shard is not None:
            mark_shard(self.weight, shard)
            mark_shard(
                self.weight_scale_inv, scale_shard(shard, (1, *fmt.scheme.block), name, "scale")
            )

    def expert(self, e: int, dtype: torch.dtype) -> torch.Tensor:
        """Expert ``e``'s weight dequantized: [out, in] in ``dtype`` (the eager path)."""
        return self.format.dequantize(self.weight[e], self.weight_scale_inv[e]).to(dtype)


def has_quantized_stacks(experts: nn.Module) -> bool:
    """Whether a ``RoutedExperts`` of the stacked layout stores its stacks quantized (Step-3.5's
    ``QuantizedStackedWeight``, or transformers' fused stacks: ``quantize_packed_stacks``)."""
    return (
        isinstance(getattr(experts, "down_proj", None), QuantizedStackedWeight)
        or packed_format(experts) is not None
    )


def has_packed_stacks(module: nn.Module) -> bool:
    """Whether ``module`` is a ``RoutedExperts`` of packed stacks (a ``gate_up_proj`` parameter [E, 2I, H])."""
    return isinstance(getattr(module, "gate_up_proj", None), nn.Parameter)


def packed_format(experts: nn.Module) -> Fp8Tensor | None:
    """The format ``quantize_packed_stacks`` made a ``RoutedExperts``' packed stacks (None: not quantized)."""
    return getattr(experts, "packed_format", None)


# transformers' fused FP8 experts (integrations/finegrained_fp8.py ``FP8Experts``): beside ``gate_up_proj`` and
# ``down_proj``, their scales ``{name}_scale_inv`` (multiplied, as FP8Linear's) and, with static activations,
# ``{name}_activation_scale`` (one an expert; loaded, not applied: the products are weight-only)
PACKED_SCALE, PACKED_ACTIVATION_SCALE = "_scale_inv", "_activation_scale"


def quantize_packed_stacks(
    experts: nn.Module,
    fmt: Fp8Tensor,
    stored: dict[str, tuple[torch.dtype, tuple[int, ...]]],
    device: str | torch.device | None = None,
) -> None:
    """A ``RoutedExperts`` of packed stacks (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) made to hold
    them in per-tensor FP8 as transformers' fused FP8 experts store them, one scale an expert and projection:
    float8 stacks of the same shapes (and shards), ``{name}_scale_inv`` of the stored shape ([E], or [E, 1, 1]
    as reported of Mistral Small 4's FP8 release) and, where stored, ``{name}_activation_scale``. ``stored``:
    checkpoint name suffix (relative to the experts) -> (dtype, shape) of the scales the checkpoint has.
    Under expert parallelism each rank's scales are its experts' (the stacks' own shard)."""
    from outpace.distributed.sharding import mark_shard

    scales = []
    for name in ("gate_up_proj", "down_proj"):
        old = getattr(experts, name)
        where = old.device if device is None else device
        weight = nn.Parameter(
            torch.empty(old.shape, dtype=torch.float8_e4m3fn, device=where), requires_grad=False
        )
        weight.checkpoint_dtypes = (torch.float8_e4m3fn,)
        mark_shard(weight, getattr(old, "shard", None))
        setattr(experts, name, weight)
        for suffix in (PACKED_SCALE, PACKED_ACTIVATION_SCALE):
            if name + suffix not in stored:
                continue
            dtype, shape = stored[name + suffix]
            scale = nn.Parameter(
                torch.empty(experts.num_experts, *shape[1:], dtype=dtype, device=where),
                requires_grad=False,
            )
            scale.checkpoint_dtypes = SCALE_DTYPES
            mark_shard(scale, experts.placement.shard)
            setattr(experts, name + suffix, scale)
            scales.append(name + suffix)
    experts.packed_format = fmt
    experts.checkpoint_scales = tuple(scales)  # (no value negative: checkpoint.py)


def packed_expert_weights(
    experts: nn.Module, e: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``e``'s gate/up [2I, H] and down [H, I] of packed stacks, dequantized to ``dtype`` where
    ``quantize_packed_stacks`` made them FP8 (the eager path)."""
    fmt = packed_format(experts)
    weights = experts.gate_up_proj[e], experts.down_proj[e]
    if fmt is None:
        return weights
    scales = (getattr(experts, n + PACKED_SCALE)[e] for n in ("gate_up_proj", "down_proj"))
    return tuple(fmt.dequantize(w, s).to(dtype) for w, s in zip(weights, scales))


def run_quantized_stacks(
    experts: nn.Module,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    layout=None,
    skipped_slots: bool = False,
    ready: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    row_scale: torch.Tensor | None = None,
):
    """A ``RoutedExperts`` of ``QuantizedStackedWeight`` gate, up and down stacks on the grouped kernels
    (layers/moe_kernels.py with their scales: the stacks are read in place, gate and up apart; ``ready``,
    ``row_scale``: the fused residual stack's, grouped_experts'); of packed per-tensor FP8 stacks
    (``quantize_packed_stacks``), as ``QuantizedExpertStacks.of_packed`` reads them."""
    if packed_format(experts) is not None:
        activation = experts.activation
        return QuantizedExpertStacks.of_packed(experts).run(
            x, weights, ids, activation.kernel, activation.limit, layout, skipped_slots,
            ready=ready, row_scale=row_scale,
        )  # fmt: skip
    from outpace.layers.grouped_experts import grouped_experts  # Triton: CUDA installs only
    from outpace.layers.quant.moe_quant_kernels import ExpertScales

    gate = experts.gate_proj if experts.activation.gated else None
    up, down = experts.up_proj, experts.down_proj
    scales = ExpertScales(
        "fp8_block",
        down.format.scheme.block,
        None if gate is None else gate.weight_scale_inv,
        up.weight_scale_inv,
        down.weight_scale_inv,
    )
    activation = experts.activation
    return grouped_experts(
        x, weights, ids, None if gate is None else gate.weight, up.weight, down.weight,
        activation.kernel, activation.limit, layout=layout, skipped_slots=skipped_slots, quant=scales,
        ready=ready, row_scale=row_scale,
    )  # fmt: skip
