"""The decoder layer the Llama family (and the drafts built like it) is made of, as eager modules: packed
q/k/v and gate/up projections (``pack_projections``), attention, the gated MLP, the pre-norm layer with
each residual add fused into the RMSNorm after it. The few-row fused paths over these modules, and the
choice between them and these, are layers/fused_decoder.py's (Gemma's layers: layers/fused_sandwich.py).

Shapes: flat tokens, ``x`` / ``h`` [num_tokens, hidden]; the attention metadata travels in the
forward context.

Tensor parallelism (outpace/distributed/): built inside ``building_in(group)``, attention splits its
heads over the ranks (q/k/v column-parallel, o row-parallel) and the MLP its intermediate rows (gate/up
column-, down row-parallel): one all-reduce each, the residual stream stays whole on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.distributed.group import build_group
from outpace.distributed.sharding import kv_head_shard, split_evenly
from outpace.layers.activation import FUSED_ACTIVATIONS, act_and_mul
from outpace.layers.linear import column_parallel, project, row_parallel
from outpace.layers.norm import RMSNorm
from outpace.layers.quant.fp8_weight import Fp8Weight
from outpace.layers.quant.int4_weight import Int4Weight
from outpace.layers.quant.linear import Fp8Block, Fp8Channel, Fp8Tensor, Int4Group, QuantizedLinear
from outpace.layers.rotary import RotaryEmbedding
from outpace.model_config import ModelConfig


class DecoderAttention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        input_size: int | None = None,
        sliding_window: int | None = None,
    ) -> None:
        """``sliding_window``: the layer's attention window (ModelConfig.layer_window); None: full."""
        super().__init__()
        self.cfg = cfg
        # EAGLE3's layer reads [embedding, hidden]: 2 * hidden
        input_size = input_size or cfg.hidden_size
        d = cfg.head_dim
        p = HeadProjections(
            input_size,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            d,
            cfg.attention_bias,
            cfg.attention_out_bias,
        )
        heads, kv_heads = p.heads, p.kv_heads
        self.q_size = heads * d  # this rank's q rows: [num_tokens, heads * head_dim]
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p.q_proj, p.k_proj, p.v_proj, p.o_proj
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.rotary = rotary
        self.attn = Attention(heads, kv_heads, d, sliding_window)
        self.qkv: PackedProjection | None = None  # set by pack_projections for serving

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape[0], self.cfg.head_dim
        if self.qkv is not None:
            q, k, v = self.qkv(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(n, -1, d)  # [num_tokens, heads, head_dim]
        k = k.view(n, -1, d)  # [num_tokens, kv_heads, head_dim]
        v = v.view(n, -1, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, positions))

    def query(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [n, in], positions [n] -> q [n, heads, head_dim], normed and rotated (eager)."""
        q = self.q_proj(x).view(x.shape[0], -1, self.cfg.head_dim)
        if self.cfg.qk_norm:
            q = self.q_norm(q)
        q, _ = self.rotary(positions, q, q[:, :0])
        return q

    def key_value(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in], positions [n] -> k, v [n, kv_heads, head_dim], k normed and rotated (eager)."""
        n, d = x.shape[0], self.cfg.head_dim
        k = self.k_proj(x).view(n, -1, d)
        v = self.v_proj(x).view(n, -1, d)
        if self.cfg.qk_norm:
            k = self.k_norm(k)
        _, k = self.rotary(positions, k[:, :0], k)
        return k, v

    def write_kv(
        self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """k and v of x [n, in] at positions [n] into this layer's paged cache at slot_mapping [n] flat
        slots, without attending (context rows a drafter reads later: DFlash)."""
        self.attn.store_kv(*self.key_value(x, positions), slot_mapping)


class HeadProjections:
    """An attention layer's q/k/v and o projections, heads split over the group being built: q (and k, v)
    column-parallel by head, kv heads replicated on size / kv_heads ranks when fewer than ranks
    (distributed/sharding.py ``kv_head_shard``), o row-parallel; ``heads`` / ``kv_heads`` this rank's.
    ``with_v=False``: no v projection (``v_proj`` None: v is k's output, Gemma 4's k = v layers);
    ``with_kv=False``: neither k nor v (a layer attending over another layer's cache)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool,
        out_bias: bool,
        with_kv: bool = True,
        with_v: bool = True,
    ) -> None:
        group, d = build_group(), head_dim
        self.heads = split_evenly(num_heads, group.size, "num_attention_heads")
        first_kv, self.kv_heads = kv_head_shard(num_kv_heads, group.rank, group.size)
        self.q_proj = column_parallel(
            input_size, num_heads * d, bias, (group.rank * self.heads * d, self.heads * d)
        )
        kv_rows = (first_kv * d, self.kv_heads * d)
        self.k_proj = (
            column_parallel(input_size, num_kv_heads * d, bias, kv_rows) if with_kv else None
        )
        self.v_proj = (
            column_parallel(input_size, num_kv_heads * d, bias, kv_rows)
            if with_kv and with_v
            else None
        )
        self.o_proj = row_parallel(
            num_heads * d, hidden_size, out_bias, "num_attention_heads * head_dim"
        )


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)); ``act`` a key of layers/activation.py's ACTIVATIONS.
    Sharded: each rank holds intermediate_size / size rows of gate and up and the matching columns of down;
    ``reduce=False``: the output is this rank's partial sum, for a caller that all-reduces (an expert)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str = "silu",
        bias: bool = False,
        reduce: bool = True,
        what: str = "intermediate_size",
    ) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = column_parallel(hidden_size, intermediate_size, bias, what=what)
        self.up_proj = column_parallel(hidden_size, intermediate_size, bias, what=what)
        self.down_proj = row_parallel(intermediate_size, hidden_size, bias, what, reduce)
        self.gate_up: PackedProjection | None = None  # set by pack_projections for serving

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, hidden] -> [n, hidden]. Few rows on the GPU with gate and up packed: their product and the
        gating in one kernel (layers/fused_projection.py ``project_swiglu``; an fp8 weight's quantized product),
        then down_proj."""
        if (
            self.gating_fuses
            and self.gate_up is not None
            and x.is_cuda
            and self.gate_up.bias is None
        ):
            from outpace.layers import fused_projection as fp  # (Triton: CUDA installs only)

            # (a tensor, or an Fp8Weight: its quantized product gates in its store)
            w = self.gate_up.weight
            if self.act in FUSED_ACTIVATIONS and (
                fp.fused_rows_apply(x, w) or fp.quantized_rows_apply(x, w)
            ):
                return self.down_proj(fp.project_swiglu(x, w, self.act))
        gate, up = (
            self.gate_up(x) if self.gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        )
        return self.down_proj(self.gated(gate, up))

    # Whether ``gated`` is act(gate) * up alone, which the fused projection kernels compute in their epilogue
    # (a subclass with more to its gating says False: layers/fused_decoder.py ``mlp_normalised``).
    gating_fuses = True

    def gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up [n, inter]: the MLP's gating of its gate and up products [n, inter] each."""
        return act_and_mul(self.act, gate, up)


class PackedProjection:
    """Several projections of one input as one matmul (q/k/v; gate/up): their weights are copied into
    one packed tensor and each projection's parameter becomes a view of its rows, so no memory is
    added and checkpoints, training and every other caller still see the separate projections.
    Not an nn.Module: the parameters stay registered where the checkpoint names them.

    Projections stored quantized (``packable``) pack their stored weights and their scales alike: ``weight`` is
    then an ``Fp8Weight`` or an ``Int4Weight`` (layers/quant/fp8_weight.py, int4_weight.py), which the fused
    few-row kernels read as they read a half-precision one."""

    def __init__(self, projections: list[nn.Module]) -> None:
        self.sizes = [p.out_features for p in projections]
        self.bias = None
        if isinstance(projections[0], QuantizedLinear):
            parts = [p.kernel_weight() for p in projections]
            per_tensor = isinstance(projections[0].format, Fp8Tensor)
            self.weight = (Fp8Weight.packed_per_tensor if per_tensor else type(parts[0]).packed)(
                parts
            )
            start = 0
            for p, size in zip(projections, self.sizes):
                part = self.weight.rows(start, start + size)
                p.stored_weight.data = part.weight
                # (a per-tensor part keeps its one scale: its blocks hold copies of it)
                if not per_tensor:
                    p.scale.data = part.scale
                start += size
            return
        self.weight = torch.cat([p.weight.data for p in projections])  # [sum(out), in]
        for p, view in zip(projections, self.weight.split(self.sizes)):
            p.weight.data = view
        if projections[0].bias is not None:
            self.bias = torch.cat([p.bias.data for p in projections])
            for p, view in zip(projections, self.bias.split(self.sizes)):
                p.bias.data = view

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [n, in] -> one [n, out_i] view per projection."""
        if isinstance(self.weight, (Fp8Weight, Int4Weight)):
            return self.weight.project(x).split(self.sizes, dim=-1)
        return project(x, self.weight, self.bias).split(self.sizes, dim=-1)


def packable(projections: list[nn.Module]) -> bool:
    """Whether ``PackedProjection`` packs these: half-precision projections, block-FP8 ones (or per-channel ones:
    blocks of one row) without bias of one block and scale dtype whose parts (but the last) hold whole blocks of
    rows, or per-tensor FP8 ones without
    bias of one scale dtype (``Fp8Weight.packed_per_tensor``: blocks of their rows' common divisor), or INT4 ones
    without bias of one group and scale dtype (a scale a row's group: any rows pack)."""
    if all(isinstance(p, nn.Linear) for p in projections):
        return True
    if all(
        isinstance(p, QuantizedLinear) and isinstance(p.format, Int4Group) and p.bias is None
        for p in projections
    ):
        weights = [p.kernel_weight() for p in projections]
        return all(
            (w.group, w.scale.dtype) == (weights[0].group, weights[0].scale.dtype) for w in weights
        )
    if all(
        isinstance(p, QuantizedLinear) and isinstance(p.format, Fp8Tensor) and p.bias is None
        for p in projections
    ):
        return len({p.scale.dtype for p in projections}) == 1
    if not all(
        isinstance(p, QuantizedLinear)
        and isinstance(p.format, (Fp8Block, Fp8Channel))
        and p.bias is None
        for p in projections
    ):
        return False
    weights = [p.kernel_weight() for p in projections]
    if any(w.block != weights[0].block or w.scale.dtype != weights[0].scale.dtype for w in weights):
        return False
    return all(w.shape[0] % w.block[0] == 0 for w in weights[:-1])


def pack_projections(model: nn.Module) -> None:
    """Serve every Llama attention's q/k/v and every MLP's gate/up as one matmul each; also the q/k/v of
    any other attention that asks for it (a ``qkv`` attribute None beside q/k/v_proj: Gemma's; beside
    q/k_proj alone, q and k: Gemma 4's layers whose v is k's projection) and the
    in-projections of a module that lists them (``in_projections()`` beside an ``in_proj`` None: gated
    DeltaNet's; all of them, else as many of the first as pack); a module with a ``pack_rows()`` packs its own.
    Projections stored quantized (layers/quant/linear.py) pack where ``packable`` says so, else stay separate."""
    for module in model.modules():
        if (
            isinstance(module, DecoderAttention) or getattr(module, "k_proj", None) is not None
        ) and getattr(module, "qkv", False) is None:
            projections = [module.q_proj, module.k_proj]
            projections += [module.v_proj] if getattr(module, "v_proj", None) is not None else []
            if packable(projections):
                module.qkv = PackedProjection(projections)
        elif isinstance(module, GatedMLP) and module.gate_up is None:
            projections = [module.gate_proj, module.up_proj]
            if packable(projections):
                module.gate_up = PackedProjection(projections)
        elif hasattr(module, "in_projections") and module.in_proj is None:  # linear attention's
            projections = module.in_projections()
            # all of them, else as many of the first as pack (stored in two formats: Qwen3.5-FP8's)
            for count in range(len(projections), 1, -1):
                if packable(projections[:count]):
                    module.in_proj = PackedProjection(projections[:count])
                    break
        elif hasattr(module, "pack_rows"):  # rows of its own (Qwen3-Next's router and shared gate)
            module.pack_rows()


def unpack_projections(model: nn.Module) -> None:
    """Undo ``pack_projections`` for training: each projection multiplies by its own parameter again (through
    the packed tensor, which its parameter only views, no gradient would reach it)."""
    for module in model.modules():
        if getattr(module, "qkv", None) is not None:
            module.qkv = None
        if isinstance(module, GatedMLP):
            module.gate_up = None
        if getattr(module, "in_proj", None) is not None and hasattr(module, "in_projections"):
            module.in_proj = None


class DecoderLayer(nn.Module):
    """The pre-norm Llama layer, eager (layers/fused_decoder.py ``FusedDecoderLayer`` adds the few-row
    fused path)."""

    def __init__(
        self, cfg: ModelConfig, rotary: RotaryEmbedding, sliding_window: int | None = None
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DecoderAttention(cfg, rotary, sliding_window=sliding_window)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> the layer's output [num_tokens, hidden] (h + attention + MLP)."""
        return residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM style: the layer's input is h + residual (h alone when residual is None) and so is its
        output, returned as (MLP output, residual) [num_tokens, hidden] each. Each residual add is
        fused into the RMSNorm after it, so a stack of layers never adds the residual on its own."""
        return pre_norm_residual(self, positions, h, residual)


def pre_norm_residual(
    layer: nn.Module,
    positions: torch.Tensor,
    h: torch.Tensor,
    residual: torch.Tensor | None,
    mixer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    feed_forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager pre-norm layer over the stream h + residual (h alone when residual is None), for any
    ``layer`` with input_layernorm and post_attention_layernorm modules (RMSNorm or Float32RMSNorm: both
    take the residual), a mixer(positions, x) (default: its self_attn; the DeepSeek layer's is MLA, a
    hybrid's its linear attention) and a feed_forward(x) (default: its mlp): (feed-forward output,
    residual) [num_tokens, hidden] each, each residual add fused into the RMSNorm after it."""
    mixer, feed_forward = mixer or layer.self_attn, feed_forward or layer.mlp
    if residual is None:
        x, residual = layer.input_layernorm(h), h
    else:
        x, residual = layer.input_layernorm(h, residual)
    x, residual = layer.post_attention_layernorm(mixer(positions, x), residual)
    return feed_forward(x), residual


def residual_stream(h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The value of the residual stream split as (h, residual) by ``forward_residual``: [num_tokens, hidden]."""
    return h if residual is None else h + residual


def run_residual_stack(
    layers: list[nn.Module], positions: torch.Tensor, h: torch.Tensor, capture: tuple[int, ...]
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Layers called as ``layer.forward_residual(positions, h, residual) -> (h, residual)`` (the stream split
    in two, so each residual add is fused into the norm after it) over h [num_tokens, hidden] -> (the last
    layer's output stream, {layer index in ``capture``: that layer's input stream})."""
    residual = None  # the stream is h + residual
    captured = {}
    for i, layer in enumerate(layers):
        if i in capture:
            captured[i] = residual_stream(h, residual)
        h, residual = layer.forward_residual(positions, h, residual)
    return residual_stream(h, residual), captured


def run_layer_stack(
    layers: list[nn.Module], positions: torch.Tensor, h: torch.Tensor, capture: tuple[int, ...]
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Layers called as ``layer(positions, h) -> h`` (each chooses its own kernels) over h [num_tokens,
    hidden] -> (the last layer's output, {layer index in ``capture``: that layer's input})."""
    captured = {}
    for i, layer in enumerate(layers):
        if i in capture:
            captured[i] = h
        h = layer(positions, h)
    return h, captured
