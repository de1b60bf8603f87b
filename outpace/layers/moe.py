"""Mixture of experts as DeepSeek-V2 and V3 define it: a router scores every routed expert for each
token, keeps ``top_k`` of them (optionally only within the best expert groups), and the layer's output is
the routed experts' SwiGLU outputs weighted by the router, plus the shared experts' output.

The router and its routing (``Router``, ``Routing``) are layers/router.py's.

The routed experts of every MoE family (DeepSeek's ``MoE`` here, Qwen3-Next, Nemotron-H, Step-3.5, Gemma 4)
are a ``RoutedExperts``: it holds their weights as the family's checkpoint lays them out (one MLP module per
expert, stacked once into tensors whose views the parameters become; or natively stacked tensors) and runs
them in ``run_experts`` (eager: the tokens sorted by expert, one call per expert in use, one host
synchronisation for the counts; the CPU path and the reference) or, on CUDA, in the grouped-expert kernels
of layers/moe_kernels.py (no host synchronisation, so a forward can be captured in a CUDA graph), with the
expert's activation (``ExpertActivation``) as the kernels' constexpr. On CUDA the ``Router`` runs the
routing kernels of layers/moe_routing_kernel.py (the torch code, ``Router.reference``, stays the CPU path and
their reference), and DeepSeek's ``MoE`` runs as five launches: the router logits, the routing with the
grouped kernels' block layout, gate/up, down, and the combine of each token's slots, its shared experts
fused with the routed ones (``shared_expert_stacks``: SGLang's shared experts fusion).

On a fused residual stack (layers/fused_decoder.py ``moe_block_fused``: Qwen3-Next, Step-3.5, one GPU) a block
costs no norm launch of its own: it reads the stream times its norm's weight, the norm's factor applied by
the routing kernel to the logits and by the gate/up kernel to the products (``RowNorm``), and the combine
adds its output to the stream and readies the next layer's norm (``ReadyStream``).

Tensor parallelism (outpace/distributed/), as the default (not expert-parallel) MoE of vLLM and SGLang
shards it (vLLM FusedMoE's intermediate_size_per_partition; SGLang deepseek_v2.py DeepseekV2MoE, whose
shared experts skip their own reduction): every rank holds every expert, and of each expert (shared ones
too) moe_intermediate_size / size rows of gate/up and the matching columns of down. The router is
replicated, so every rank picks the same experts; each rank's experts return partial sums, and the routed
plus shared output is summed over the ranks with one all-reduce. The grouped kernels take the sharded
stacks as they are (each expert is a narrower SwiGLU).

Expert parallelism (``EngineConfig.expert_parallel_size``, distributed/group.py): the routed experts are
placed whole on the ranks of the expert group, expert e on rank e // (experts / size) (``ExpertPlacement``;
a count that does not split is refused), and each rank reads only its experts from the checkpoint. The
router is replicated; every rank holds every token (the activations are replicated between layers, as under
TP), computes its own experts' contributions for all of them (the others' slots skipped: on the kernels the
routing kernel writes the block layout of this rank's experts alone, layers/moe_routing_kernel.py 4., so a
rank launches what one GPU does; the combine kernel skips the other ranks' slots, layers/moe_kernels.py
``skipped_slots``) and one all-reduce sums the ranks' partial outputs: the tokens are "dispatched" by the
routing every rank computed alike, and "combined" by the reduction. Where the expert group is the
tensor-parallel group (EP = TP) that is the all-reduce the layer already makes for its shared experts; with
TP = 1 the routed experts reduce over the expert group themselves (``RoutedExperts.run``) and the replicated
shared experts are added after.

Why an all-reduce and not an all-to-all at decode sizes: an all-to-all moves each token to the ranks of its
experts and back, about 2 x top_k x (1 - 1 / size) rows of hidden values per token where an all-reduce moves
2 x (1 - 1 / size) rows per token (ring), and its sends depend on the routing, so it needs the counts first
(a host synchronisation or a padded worst case) while the all-reduce has a fixed shape (capturable in a CUDA
graph with the rest of the step). With replicated activations nothing needs dispatching at all: the routing
is already on every rank. distributed/dispatch_bytes.py computes the bytes per decode step of both at the
DeepSeek-V3 shape; the all-to-all pays off once the activations are partitioned (data-parallel attention) and
the batch is large, which outpace does not do yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import torch
from torch import nn

from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import (
    SINGLE,
    RankGroup,
    build_expert_group,
    build_group,
    building_in,
)
from outpace.distributed.sharding import Shard, ShardingError, mark_shard, split_evenly
from outpace.layers.activation import ACTIVATIONS, act_and_mul
from outpace.layers.linear import project
from outpace.layers.quant.experts import (
    QuantizedExpertStacks,
    QuantizedShared,
    QuantizedStackedWeight,
    grouped_kernels_take,
    has_quantized_experts,
    has_quantized_stacks,
    packed_expert_weights,
    quantized_shared_stacks,
    run_quantized_experts,
    run_quantized_stacks,
    slot_views,
)
from outpace.layers.router import Router, Routing, RoutingModule

if TYPE_CHECKING:
    from outpace.layers.normed_rows import NormedRows


def run_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: Sequence[Callable[[torch.Tensor], torch.Tensor]],
) -> torch.Tensor:
    """x [n, hidden]; weights [n, top_k] float32; ids [n, top_k] -> sum over j of weights[:, j] times
    expert ids[:, j] applied to x: [n, hidden] in x's dtype, accumulated in float32. Slots whose id is not
    one of ``experts`` (-1: another rank's expert, ``ExpertPlacement.local_ids``) are skipped.

    The tokens are sorted by expert and each expert runs once over its rows (one host sync for the
    per-expert counts): the place a grouped-GEMM kernel takes over on the GPU."""
    top_k, here = ids.shape[1], len(experts)
    local = ids.flatten()  # [n * top_k]
    local = local.masked_fill((local < 0) | (local >= here), here)  # others' experts: sorted last
    order = local.argsort(stable=True)  # [n * top_k]: (token, slot) by expert
    counts = torch.bincount(local, minlength=here + 1).tolist()
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert, rows in zip(experts, order.split(counts)):  # (the last split: others' slots)
        if rows.numel():
            tokens = rows // top_k  # [rows]
            y = expert(x.index_select(0, tokens)).float() * weights.flatten()[rows, None]
            out.index_add_(0, tokens, y)
    return out.to(x.dtype)


def experts_off_the_kernels(model: nn.Module) -> list[str]:
    """The names of ``model``'s routed experts that the grouped kernels do not take (``RoutedExperts.kernels_take``):
    on the GPU they run one by one, which a captured step cannot hold."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, RoutedExperts) and not module.kernels_take()
    ]


# ACTIVATIONS keys -> the grouped kernels' activation (layers/moe_kernels.py ACTIVATIONS); the tanh GELUs
# are one formula (layers/activation.py)
_KERNEL_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "relu2": "relu2",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}


@dataclass(frozen=True)
class ExpertActivation:
    """What an expert computes between its input and down projections, over [rows, inter]: gated,
    ``ACTIVATIONS[name](gate) * up``, or with ``limit`` L ``ACTIVATIONS[name](gate).clamp(max=L) *
    up.clamp(-L, L)`` (Step-3.5's SwiGLU clamp, vLLM SwigluStepAndMul); ungated, ``ACTIVATIONS[name](up)``
    (Nemotron-H's relu2)."""

    name: str  # a key of layers/activation.py ACTIVATIONS
    gated: bool = True
    limit: float | None = None

    def __post_init__(self) -> None:
        if self.name not in ACTIVATIONS:
            raise ValueError(f"unknown expert activation {self.name!r}")
        if self.limit is not None and not self.gated:
            raise ValueError("the clamp limit applies to gated experts only")

    @property
    def kernel(self) -> str | None:
        """The grouped kernels' name for it, None where they lack it (the experts then run eagerly)."""
        return _KERNEL_ACTIVATIONS.get(self.name)

    def __call__(self, gate: torch.Tensor | None, up: torch.Tensor) -> torch.Tensor:
        """gate (None when ungated), up [rows, inter] -> [rows, inter]: the torch formula."""
        if not self.gated:
            return ACTIVATIONS[self.name](up)
        if self.limit is None:
            return act_and_mul(self.name, gate, up)
        return ACTIVATIONS[self.name](gate).clamp(max=self.limit) * up.clamp(
            -self.limit, self.limit
        )


@dataclass(frozen=True)
class ExpertPlacement:
    """The routed experts this rank holds: ``first`` .. ``first + count`` of ``total``, whole. ``group``: the
    expert-parallel group they are placed over (None: every expert on every rank, as under TP);
    ``reduces_itself``: the expert group is not the layer's tensor-parallel group (TP = 1), so the experts'
    output is summed over it by ``RoutedExperts.run`` (module docstring)."""

    total: int
    first: int
    count: int
    group: RankGroup | None = None
    reduces_itself: bool = False

    @classmethod
    def building(cls, total: int) -> ExpertPlacement:
        """The placement of ``total`` experts in the model being built (distributed/group.py): expert e on
        rank e // (total / size) of the expert group, or all of them here."""
        group = build_expert_group()
        if group is None:
            return cls(total, 0, total)
        if total % group.size:
            raise ShardingError(
                f"the model's {total} routed experts do not split over expert_parallel_size="
                f"{group.size} ranks: it must divide the expert count (n_routed_experts, num_experts)"
            )
        count = total // group.size
        return cls(total, group.rank * count, count, group, build_group().size == 1)

    @property
    def shard(self) -> Shard | None:
        """This rank's experts of a stacked checkpoint tensor [total, ...] (None: all of them)."""
        return None if self.group is None else Shard(0, self.first, self.count, self.total)

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [n, top_k] of all experts -> the same as indices of this rank's experts, -1 where another
        rank's expert was chosen (the grouped kernels skip those slots)."""
        local = ids - self.first
        return local.masked_fill((local < 0) | (local >= self.count), -1)


def expert_modules(num_experts: int, make_expert: Callable[[], nn.Module]) -> list[nn.Module]:
    """The modules of the routed experts this rank holds (for ``RoutedExperts``' ``experts`` layout, with
    ``num_experts``), ``make_expert()`` each: every expert, its rows split over the tensor-parallel group as
    ``make_expert`` builds it, or under expert parallelism this rank's experts only, each built whole."""
    placement = ExpertPlacement.building(num_experts)
    if placement.group is None:
        return [make_expert() for _ in range(num_experts)]
    with building_in(SINGLE):
        return [make_expert() for _ in range(placement.count)]


def expert_rows_group() -> RankGroup:
    """The group each routed expert's rows split over in the model being built: its tensor-parallel group,
    or ``SINGLE`` where the experts are placed whole (expert parallel)."""
    return SINGLE if build_expert_group() is not None else build_group()


class StackedWeight(nn.Module):
    """One projection of every routed expert as a single [experts, out, in] parameter (``weight``)."""

    def __init__(self, experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))

    def expert(self, e: int, dtype: torch.dtype) -> torch.Tensor:
        """Expert ``e``'s weight [out, in] (as layers/quant/experts.py ``QuantizedStackedWeight``'s)."""
        return self.weight[e]


class RoutedExperts(nn.Module):
    """The routed experts of a mixture: x [n, hidden], weights [n, top_k] float32, ids [n, top_k] -> the sum
    over slots j of weights[:, j] times expert ids[:, j] applied to x, [n, hidden] in x's dtype. On CUDA, for
    an activation the kernels have, the grouped kernels (layers/moe_kernels.py); elsewhere ``run_experts``.

    Its weights, as the family's checkpoint names them (relative to this module), one layout of three:
    - ``experts``: one MLP module per expert (``{e}.{gate,up,down}_proj.weight``, or ``{e}.{up,down}_proj``
      ungated; DeepSeek, Qwen3-Next, Nemotron-H), each run by its own forward on the eager path; stacked for
      the kernels on first use (``stacks``); a module's projections may be this rank's tensor-parallel
      shard (narrower experts);
    - ``stacked=(experts, hidden, inter), packed=True``: ``gate_up_proj`` [experts, 2 * inter, hidden] (gate
      rows first) and ``down_proj`` [experts, hidden, inter] (transformers' fused experts: Gemma 4);
    - ``stacked=..., packed=False``: ``{gate,up,down}_proj.weight`` [experts, out, in] (Step-3.5).

    Under expert parallelism (module docstring) it holds this rank's experts only (``placement``): the
    modules of experts ``first ..`` (``expert_modules`` builds them whole), registered under their indices
    among all experts, or stacks of ``count`` experts read as that slice of the checkpoint's stacks."""

    def __init__(
        self,
        activation: ExpertActivation,
        experts: Sequence[nn.Module] = (),
        stacked: tuple[int, int, int] | None = None,
        packed: bool = True,
        num_experts: int | None = None,
    ) -> None:
        """``experts``: the expert modules this rank holds, of ``num_experts`` in all (default: these are
        all); ``stacked``: (all experts, hidden, inter) of the stacked layouts."""
        super().__init__()
        experts = list(experts)
        if bool(experts) == (stacked is not None):
            raise ValueError("RoutedExperts holds either expert modules or stacked weights")
        self.activation = activation
        total = stacked[0] if stacked is not None else num_experts or len(experts)
        self.placement = ExpertPlacement.building(total)
        if experts and len(experts) != self.placement.count:
            raise ValueError(
                f"{len(experts)} expert modules given for this rank's {self.placement.count} of "
                f"{total} experts (expert parallel: build them with layers/moe.py expert_modules)"
            )
        self.per_expert = experts  # (registered below under their checkpoint names)
        for e, expert in enumerate(self.per_expert):
            self.add_module(str(self.placement.first + e), expert)
        self.num_experts = self.placement.count  # (the experts held here)
        self._stacks: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None
        # quantized expert modules' stacks for the grouped kernels (layers/quant/experts.py, on first use)
        self.quantized_stacks: QuantizedExpertStacks | None = None
        if stacked is not None:
            _, hidden, inter = stacked
            if packed:
                if not activation.gated:
                    raise ValueError("packed gate/up stacks hold gated experts")
                self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * inter, hidden))
                self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, inter))
            else:
                if activation.gated:
                    self.gate_proj = StackedWeight(self.num_experts, inter, hidden)
                self.up_proj = StackedWeight(self.num_experts, inter, hidden)
                self.down_proj = StackedWeight(self.num_experts, hidden, inter)
            for param in self.parameters():
                mark_shard(param, self.placement.shard)

    def checkpoint_tensors_elsewhere(self) -> list[str]:
        """The names (relative to this module) of the checkpoint's expert tensors that other ranks hold and
        this one never reads (checkpoint.py skips them): the other experts' modules' tensors."""
        if self.placement.group is None or not self.per_expert:
            return []
        here = range(self.placement.first, self.placement.first + self.placement.count)
        # (parameters and stored buffers: a quantized expert's scales too)
        names = list(self.per_expert[0].state_dict())
        return [f"{e}.{n}" for e in range(self.placement.total) if e not in here for n in names]

    def __len__(self) -> int:
        return self.num_experts

    def __getitem__(self, e: int) -> nn.Module:
        """Expert ``e``'s module (the ``experts`` layout)."""
        return self.per_expert[e]

    def __iter__(self):
        return iter(self.per_expert)

    # the grouped kernels: None on CUDA tensors without autograd (they have no backward: training takes
    # run_experts, as layers/activation.py silu_and_mul does), True / False forces either (tests)
    kernels: bool | None = None

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.run(x, weights, ids)

    def uses_kernels(self, x: torch.Tensor) -> bool:
        """Whether ``run`` takes the grouped kernels for x (``kernels``; ``kernels_take`` these experts)."""
        use = x.is_cuda and not torch.is_grad_enabled() if self.kernels is None else self.kernels
        return use and self.kernels_take()

    def kernels_take(self) -> bool:
        """Whether the grouped kernels can run these experts: an activation they have and, experts stored
        quantized, a format and shapes the quantized grouped kernels take (layers/quant/experts.py). Else the
        GPU runs them one by one (``run_experts``: a host sync, which no CUDA graph can hold)."""
        quantized = has_quantized_experts(self) or has_quantized_stacks(self)
        return self.activation.kernel is not None and (not quantized or grouped_kernels_take(self))

    def run(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        shared: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None,
        layout=None,
        quantized_shared: QuantizedShared | None = None,
        shared_input: torch.Tensor | None = None,
        ready: ReadyStream | None = None,
        row_scale: torch.Tensor | None = None,
    ):
        """The experts' output (class docstring); ``forward`` unless a subclass adds the router. On the
        kernels, ``shared``: shared experts' stacks fused with the routed ones, ``layout``: the block
        layout of this rank's experts (``placement``) the routing kernel wrote (layers/moe_kernels.py
        grouped_experts; the kernels then read it, not ids); ``quantized_shared``: a quantized shared
        MLP's slots fused with quantized experts (layers/quant/experts.py ``quantized_shared_stacks``);
        ``shared_input``: the rows ``shared``'s slots read, whose output then comes apart: (the routed
        output, theirs) (``experts_and_dense_on_kernels``); ``ready``: the output added to a residual stream
        and made ready for the next norm (``ReadyStream``), in the grouped kernels' combine where it can be;
        ``row_scale`` [n] float32: x is a stream times its norm's weight, each token's norm factor applied by
        the grouped kernels (``RowNorm.scale``, ``takes_row_scale``).

        Expert parallel (``placement``): ids name every expert; the slots of this rank's experts are
        computed, the others skipped, and where the experts reduce themselves (TP = 1) the ranks' outputs
        are summed here, so that the output is always this rank's partial sum over the layer's
        tensor-parallel group (module docstring)."""
        placement = self.placement
        # [n, top_k]: this rank's experts' indices, -1 where another rank's was chosen or the row routes
        # nowhere (layers/routed_rows.py: the routing kernel's layout says so)
        skipped = placement.group is not None or (layout is not None and layout.skips)
        if skipped:
            ids = placement.local_ids(ids) if layout is None else layout.ids
        quantized = has_quantized_experts(self) or has_quantized_stacks(self)
        if (shared is not None and quantized) or (quantized_shared is not None and not quantized):
            raise ValueError(
                "shared experts fuse as stacks with half-precision experts, as QuantizedShared with "
                "quantized ones"
            )
        if shared_input is not None and (
            shared is None or not self.uses_kernels(x) or placement.reduces_itself
        ):
            raise ValueError(
                "shared slots with an input of their own run as half-precision stacks on the grouped "
                "kernels, where the experts do not reduce over their own group"
            )
        if row_scale is not None and not self.takes_row_scale(x):
            raise ValueError(
                "a row scale is applied by the grouped kernels of experts that do not "
                "reduce over their own group"
            )
        # the grouped kernels' combine adds the output to the stream and readies the next norm, unless the
        # experts reduce over their own group first
        kernel_ready = None if ready is None or placement.reduces_itself else tuple(ready)
        if self.uses_kernels(x) and quantized:
            if has_quantized_experts(self):
                out = run_quantized_experts(
                    self,
                    x,
                    weights,
                    ids,
                    layout,
                    skipped,
                    quantized_shared,
                    kernel_ready,
                    row_scale,
                )
            elif quantized_shared is not None:
                raise ValueError("quantized stacked experts fuse no shared MLP")
            else:
                out = run_quantized_stacks(
                    self, x, weights, ids, layout, skipped, kernel_ready, row_scale
                )
            if kernel_ready is not None:
                return out  # (NormedRows)
        elif self.uses_kernels(x):
            from outpace.layers.grouped_experts import grouped_experts  # Triton: CUDA installs only

            out = grouped_experts(
                x,
                weights,
                ids,
                *self.stacks(),
                activation=self.activation.kernel,
                limit=self.activation.limit,
                shared=shared,
                layout=layout,
                skipped_slots=skipped,
                shared_input=shared_input,
                ready=kernel_ready,
                row_scale=row_scale,
            )
            if kernel_ready is not None:
                return out  # (NormedRows)
        else:
            if shared is not None or quantized_shared is not None or layout is not None:
                raise ValueError(
                    "fused shared experts run on the grouped kernels only (a block layout too)"
                )
            out = run_experts(x, weights, ids, self.eager_experts())
        out = all_reduce(out, placement.group) if placement.reduces_itself else out
        return out if ready is None else ready.add(out)

    def takes_row_scale(self, x: torch.Tensor) -> bool:
        """Whether ``run`` takes a ``row_scale`` for x: the grouped kernels (over half-precision or quantized
        stacks alike: the scale multiplies the float32 products) of experts that do not reduce over an expert
        group of their own."""
        return self.uses_kernels(x) and not self.placement.reduces_itself

    def eager_experts(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """Each expert as run_experts calls it: its module, or ``stacked_expert`` of its index."""
        return self.per_expert or [partial(self.stacked_expert, e) for e in range(self.num_experts)]

    def stacked_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` of the stacked layouts over x [rows, hidden] -> [rows, hidden] (the eager path)."""
        if isinstance(self.down_proj, (StackedWeight, QuantizedStackedWeight)):
            gate = project(x, self.gate_proj.expert(e, x.dtype)) if self.activation.gated else None
            up = project(x, self.up_proj.expert(e, x.dtype))
            return project(self.activation(gate, up), self.down_proj.expert(e, x.dtype))
        gate_up, down = packed_expert_weights(self, e, x.dtype)
        gate, up = project(x, gate_up).chunk(2, dim=-1)
        return project(self.activation(gate, up), down)

    def stacks(self) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """The weights as the grouped kernels read them: gate (None when ungated) and up [experts, inter,
        hidden], down [experts, hidden, inter].

        The ``experts`` layout is stacked on first use: the weights are copied into a gate/up tensor
        [experts, 2 * inter, hidden] (gate rows first; up alone when ungated) and a down tensor, and every
        expert's parameters (and its packed gate/up, layers/decoder.py PackedProjection) become views of
        them, so no memory is added and in-place changes to the parameters (loading, optimiser steps) reach
        the kernels. Restacked when a parameter has been given other storage since (``Module.to``,
        ``load_state_dict`` with assign)."""
        if not self.per_expert:
            if isinstance(self.down_proj, StackedWeight):
                gate = self.gate_proj.weight if self.activation.gated else None
                return gate, self.up_proj.weight, self.down_proj.weight
            inter = self.down_proj.shape[2]
            return self.gate_up_proj[:, :inter], self.gate_up_proj[:, inter:], self.down_proj
        first, gated = self.per_expert[0], self.activation.gated
        first_in = first.gate_proj if gated else first.up_proj
        if (
            self._stacks is not None
            and first.down_proj.weight.data_ptr() == self._stacks[2].data_ptr()
            and first_in.weight.data_ptr() == self._stacks[1 - gated].data_ptr()
        ):
            return self._stacks
        # Plain tensors even inside inference mode: the parameters become views of them. Each expert's weights
        # are copied straight into their rows and moved there at once, so its own storage is released before
        # the next expert's copy: the layer's experts take at most one stack's size more while they move (a
        # list of per-expert concatenations stacked took two gate/up stacks more: 42 GiB of Kimi-K2's layer,
        # which ran out of an H100's memory, benchmarks/results/gpu_2026-12-07b call 4).
        with torch.no_grad(), torch.inference_mode(False):
            names = ("gate_proj", "up_proj") if gated else ("up_proj",)
            inter, hidden = first_in.weight.shape
            num = len(self.per_expert)
            gate_up = first_in.weight.new_empty(num, len(names) * inter, hidden)
            for e, expert in enumerate(self.per_expert):
                for i, name in enumerate(names):
                    rows = gate_up[e, i * inter : (i + 1) * inter]
                    rows.copy_(getattr(expert, name).weight)
                    getattr(expert, name).weight.data = rows
                if getattr(expert, "gate_up", None) is not None:
                    expert.gate_up.weight = gate_up[e]
            down = first.down_proj.weight.new_empty(num, *first.down_proj.weight.shape)
            for e, expert in enumerate(self.per_expert):
                down[e].copy_(expert.down_proj.weight)
                expert.down_proj.weight.data = down[e]
        self._stacks = (gate_up[:, :inter] if gated else None, gate_up[:, -inter:], down)
        return self._stacks


def stacked_experts(
    activation: str, num_experts: int, hidden_size: int, intermediate_size: int
) -> RoutedExperts:
    """Routed experts as checkpoints that stack them hold them (transformers' fused experts, e.g.
    Qwen3VLMoeTextExperts, Mistral4Experts): ``gate_up_proj`` [experts, 2 * inter, hidden] (gate rows first)
    and ``down_proj`` [experts, hidden, inter], or both transposed, as some hub checkpoints store them (read
    either way: checkpoint.py ``checkpoint_swap``). Under tensor parallelism each rank holds inter / size of
    every expert's gate and up rows and the matching columns of down."""
    rows = expert_rows_group()
    size = split_evenly(intermediate_size, rows.size, "moe_intermediate_size")
    experts = RoutedExperts(ExpertActivation(activation), stacked=(num_experts, hidden_size, size))
    if rows.size > 1:
        first = rows.rank * size
        mark_shard(experts.gate_up_proj, Shard(1, first, size, 2 * intermediate_size, blocks=2))
        mark_shard(experts.down_proj, Shard(2, first, size, intermediate_size))
    experts.gate_up_proj.checkpoint_swap = experts.down_proj.checkpoint_swap = (1, 2)
    return experts


@dataclass(frozen=True)
class RowNorm:
    """A MoE block's input on a fused residual stack: x is the stream times its RMSNorm's weight
    (``NormedRows.normed``, layers/normed_rows.py), each row's norm factor rsqrt(mean(stream^2) + eps)
    still to apply. The routing kernel computes it from the stream's partial sums of squares, scales the
    row's logits by it and writes it into ``scale``; the grouped gate/up kernel scales the row's products
    (layers/moe_routing_kernel.py, layers/moe_kernels.py): the norm costs no launch of its own."""

    sq_parts: torch.Tensor  # [P, n] float32: each row's sum of squares in P parts
    eps: float
    hidden: int  # the width the mean is over
    scale: torch.Tensor  # [n] float32, written by the routing kernel
    rows: NormedRows  # what it was made of: a shared MLP beside the experts reads them (``moe_on_kernels``)

    @classmethod
    def of(cls, rows: NormedRows, eps: float) -> RowNorm:
        """The row norm of ``rows`` (``NormedRows``) for the RMSNorm of eps ``eps`` they were made ready for."""
        sq = rows.sq_parts
        scale = torch.empty(sq.shape[1], dtype=torch.float32, device=sq.device)
        return cls(sq, eps, rows.normed.shape[1], scale, rows)


class ReadyStream(NamedTuple):
    """Where a MoE block's output goes on the fused residual stack (layers/fused_decoder.py
    ``run_fused_layers``): added to ``stream`` [n, hidden] and made ready for the RMSNorm after the block,
    of scale offset + weight (``NormedRows``), in the grouped kernels' combine (layers/moe_kernels.py).
    ``addend`` [n, hidden]: another output of the block, added to the experts' (rounded, as a tensor add
    rounds) before the stream: a shared MLP that runs beside the experts (``moe_on_kernels``)."""

    stream: torch.Tensor
    weight: torch.Tensor
    offset: float
    addend: torch.Tensor | None = None

    def add(self, out: torch.Tensor) -> NormedRows:
        """out [n, hidden] (plus the addend) added to the stream and made ready, in a launch of its own
        (where the block's output did not come from the combine)."""
        from outpace.layers.normed_rows import normed_rows  # (Triton: on the fused paths only)

        out = out if self.addend is None else out + self.addend
        return normed_rows(out, self.weight, self.offset, residual=self.stream)


class MoE(nn.Module):
    """Routed experts plus shared experts: [n, hidden] -> [n, hidden]. Checkpoint names (DeepSeek's and
    transformers'): ``gate.weight``, ``gate.e_score_correction_bias``, ``experts.{e}.{gate,up,down}_proj``,
    ``shared_experts.{gate,up,down}_proj``.

    The routed experts are a ``RoutedExperts`` of the family's MLP modules (the grouped kernels on CUDA)."""

    def __init__(
        self,
        hidden_size: int,
        routing: Routing,
        expert_size: int,
        num_shared: int,
        make_mlp: Callable[..., nn.Module],
        shared_bias: bool = False,
        experts: RoutedExperts | None = None,
    ) -> None:
        """``make_mlp(intermediate_size, bias, reduce=False, what=name)``: a gate/up/down SwiGLU MLP (the model
        family's ``GatedMLP``) returning this rank's partial sum; the routed experts have ``expert_size`` and no
        biases, the shared experts are one MLP of num_shared * expert_size (transformers DeepseekV2Moe: biases
        there only with the config's mlp_bias). ``experts``: the routed experts where the checkpoint stacks
        them (default: one ``make_mlp`` module per expert)."""
        super().__init__()
        self.group = build_group()
        self.gate = Router(hidden_size, routing)
        if experts is None:
            modules = expert_modules(
                routing.num_experts,
                partial(make_mlp, expert_size, False, reduce=False, what="moe_intermediate_size"),
            )
            experts = RoutedExperts(
                ExpertActivation(modules[0].act), modules, num_experts=routing.num_experts
            )
        self.experts = experts
        self.shared_experts = (
            make_mlp(
                expert_size * num_shared,
                shared_bias,
                reduce=False,
                what="moe_intermediate_size * n_shared_experts",
            )
            if num_shared
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (the partial sums of every rank's expert rows)
        return all_reduce(self.partial(x), self.group)

    def partial(
        self, x: torch.Tensor, ready: ReadyStream | None = None, row_norm: RowNorm | None = None
    ):
        """This rank's part of ``forward``'s output [n, hidden] (every expert's rows split over the ranks);
        with ``ready`` added to a stream and made ready for the next norm (``NormedRows``); with ``row_norm``
        x is a stream times the norm's weight (``takes_normed_rows``): layers/fused_decoder.py
        ``moe_block_fused``'s block."""
        if self.experts.uses_kernels(x):
            return self.grouped(x, ready, row_norm)
        out = self.experts(x, *self.gate(x))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out if ready is None else ready.add(out)

    def takes_normed_rows(self, x: torch.Tensor) -> bool:
        """Whether ``partial`` takes x [n, hidden] as a stream made ready for its norm (``RowNorm``:
        ``takes_normed_rows`` of its router, experts and shared experts)."""
        return takes_normed_rows(self.gate, self.experts, self.shared_experts, x)

    def grouped(
        self, x: torch.Tensor, ready: ReadyStream | None = None, row_norm: RowNorm | None = None
    ):
        """This rank's routed plus shared output on the kernels (``moe_on_kernels``, whose ``ready`` and
        ``row_norm`` these are)."""
        return moe_on_kernels(
            x, self.gate, self.experts, self.shared_experts, ready=ready, row_norm=row_norm
        )


def moe_on_kernels(
    x: torch.Tensor,
    router: RoutingModule,
    experts: RoutedExperts,
    shared_mlp: nn.Module | None = None,
    router_input: torch.Tensor | None = None,
    ready: ReadyStream | None = None,
    row_norm: RowNorm | None = None,
):
    """x [n, hidden] -> this rank's routed plus shared output [n, hidden] on the kernels: the router with
    the grouped kernels' block layout (one launch after the logits' on CUDA), the shared MLP fused with the
    routed experts when it can be (``shared_expert_stacks``), else added after them (with ``ready``, in the
    experts' combine: ``ReadyStream.addend``). Any family whose
    MoE block is a router, a RoutedExperts and a weight-1 shared MLP can call it; ``router_input`` [n,
    hidden]: what the router reads where it is not x (Gemma 4: the stream before the experts' norm);
    ``ready``: the output added to a stream and made ready for the next norm (``NormedRows``); ``row_norm``:
    x is a stream times its norm's weight (``takes_normed_rows``), which a shared MLP beside the experts reads
    through the norm-folding projections (layers/fused_decoder.py ``mlp_normalised``)."""
    fused = FusedShared.of(shared_mlp, experts)
    if fused.count == 0 and shared_mlp is not None:
        if row_norm is None:
            beside = partial(shared_mlp, x)
        else:  # (``takes_normed_rows``: it reads the rows as the routing and the experts do)
            from outpace.layers.fused_decoder import mlp_normalised  # (imports this module)

            beside = partial(mlp_normalised, shared_mlp, row_norm.rows, row_norm.eps)
        return experts_and_beside(x, router, experts, beside, router_input, ready, row_norm)
    return experts_on_kernels(
        x, router, experts, fused, router_input, ready=ready, row_norm=row_norm
    )


def experts_and_beside(
    x: torch.Tensor,
    router: RoutingModule,
    experts: RoutedExperts,
    beside: Callable[[], torch.Tensor],
    router_input: torch.Tensor | None = None,
    ready: ReadyStream | None = None,
    row_norm: RowNorm | None = None,
):
    """x [n, hidden] through the experts on the kernels (``experts_on_kernels``, no shared slots) plus
    ``beside()`` [n, hidden], the output of a shared MLP that runs beside them: with ``ready``, added in the
    experts' combine with the stream (``ReadyStream.addend``: two launches fewer than a tensor add and the
    norm kernel, the same bits), else a tensor add after them. ``row_norm``: ``experts_on_kernels``'."""
    if ready is None:
        routed = experts_on_kernels(
            x, router, experts, FusedShared(), router_input, row_norm=row_norm
        )
        return routed + beside()
    ready = ready._replace(addend=beside())
    return experts_on_kernels(
        x, router, experts, FusedShared(), router_input, ready=ready, row_norm=row_norm
    )


def takes_normed_rows(
    router: RoutingModule, experts: RoutedExperts, shared_mlp: nn.Module | None, x: torch.Tensor
) -> bool:
    """Whether ``moe_on_kernels`` takes its input as a stream made ready for its norm (``RowNorm``) for x
    [n, hidden]: routing on the kernels, grouped kernels that take the norm's row scale
    (``RoutedExperts.takes_row_scale``) and any shared MLP fused with them or, beside them, reading the rows
    through the norm-folding projections (layers/fused_decoder.py ``mlp_reads_rows``)."""
    from outpace.layers.fused_decoder import mlp_reads_rows  # (imports this module)

    return (
        router.uses_kernel(x)
        and experts.takes_row_scale(x)
        and (
            shared_mlp is None
            or FusedShared.of(shared_mlp, experts).count > 0
            or mlp_reads_rows(shared_mlp)
        )
    )


def experts_and_dense_on_kernels(
    x: torch.Tensor,
    router: RoutingModule,
    experts: RoutedExperts,
    dense_mlp: nn.Module,
    dense_input: torch.Tensor,
    router_input: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x [n, hidden] (the experts' input) through the experts ``router`` chooses from ``router_input`` (else
    x), and a dense MLP beside them over its own input ``dense_input`` [n, hidden], fused as shared slots
    whose input and output stay apart (layers/moe_kernels.py: Gemma 4's MLP) -> (this rank's routed output,
    the MLP's), each [n, hidden]; None where the MLP cannot fuse (``shared_expert_stacks``: its width,
    activation or dtype; quantized experts): the caller runs it."""
    fused = FusedShared.of(dense_mlp, experts)
    if fused.stacks is None:
        return None
    return experts_on_kernels(x, router, experts, fused, router_input, shared_input=dense_input)


def experts_on_kernels(
    x: torch.Tensor,
    router: RoutingModule,
    experts: RoutedExperts,
    fused: FusedShared,
    router_input: torch.Tensor | None = None,
    shared_input: torch.Tensor | None = None,
    ready: ReadyStream | None = None,
    row_norm: RowNorm | None = None,
):
    """x [n, hidden] -> this rank's routed output plus that of the shared experts ``fused`` with them [n,
    hidden] on the kernels: the router with the grouped kernels' block layout of this rank's experts
    (every expert but under expert parallelism) and ``fused.count`` shared slots a token
    (``moe_on_kernels``' arguments otherwise); with ``shared_input`` the shared slots read it and their
    output comes apart, with ``ready`` it is added to a stream (``RoutedExperts.run``); with ``row_norm`` x
    is a stream times its norm's weight, the norm applied by the routing and gate/up kernels."""
    routed = x if router_input is None else router_input
    weights, ids, layout = router(routed, fused.count, layout=experts.placement, row_norm=row_norm)
    return experts.run(
        x,
        weights,
        ids,
        layout=layout,
        shared_input=shared_input,
        ready=ready,
        row_scale=None if row_norm is None else row_norm.scale,
        **fused.run_args(),
    )


@dataclass(frozen=True)
class FusedShared:
    """How the grouped kernels fuse a shared MLP with the routed experts (``of``): as ``stacks`` over
    half-precision experts (``shared_expert_stacks``), as ``quantized`` views of its weights and scales over
    quantized ones (layers/quant/experts.py ``quantized_shared_stacks``), or not at all (it runs beside
    them)."""

    stacks: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None
    quantized: QuantizedShared | None = None

    @classmethod
    def of(cls, mlp: nn.Module | None, experts: RoutedExperts) -> FusedShared:
        """Nothing fuses where the experts reduce over an expert group of their own (expert parallel with
        TP = 1: the routed output is summed over the ranks, the replicated shared MLP must not be)."""
        if mlp is None or experts.placement.reduces_itself:
            return cls()
        stacks = shared_expert_stacks(mlp, experts)
        return cls(stacks, None if stacks is not None else quantized_shared_stacks(mlp, experts))

    @property
    def count(self) -> int:
        """Shared slots per token."""
        if self.stacks is not None:
            return self.stacks[1].shape[0]
        return 0 if self.quantized is None else self.quantized.count

    def run_args(self) -> dict:
        """``RoutedExperts.run``'s keyword arguments for them."""
        return dict(shared=self.stacks, quantized_shared=self.quantized)


def shared_expert_stacks(
    mlp: nn.Module | None, experts: RoutedExperts
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None:
    """A shared MLP (``{gate,up,down}_proj``, or ``{up,down}_proj`` ungated) as more experts of the routed
    experts' (this rank's) width, for the grouped kernels' shared experts fusion (layers/moe_kernels.py):
    gate (None ungated) and up [shared, inter, hidden], down [shared, hidden, inter], views of its own
    parameters (packed or not, this rank's shard: its rows split into experts of the routed width, each
    row's activation its own and the down projection's column blocks summing). None when it cannot fuse:
    no MLP, biases, another activation, gating or SwiGLU clamp (an MLP's ``limit``: Step-3.5's; the
    kernels clamp every slot with the routed experts' limit), weights of another dtype (quantized) or not
    contiguous, a width that is not a multiple of the routed experts'."""
    if mlp is None or has_quantized_experts(experts) or has_quantized_stacks(experts):
        # (over quantized experts: layers/quant/experts.py quantized_shared_stacks)
        return None
    down_r = experts.stacks()[2]  # [experts, hidden, inter]
    inter = down_r.shape[2]
    gated = getattr(mlp, "gate_proj", None) is not None
    projections = ((mlp.gate_proj,) if gated else ()) + (mlp.up_proj, mlp.down_proj)
    weights = [p.weight for p in projections]
    if (
        any(getattr(p, "bias", None) is not None for p in projections)
        or getattr(mlp, "act", None) != experts.activation.name
        or gated != experts.activation.gated
        or getattr(mlp, "limit", None) != experts.activation.limit
        or any(w.dtype != down_r.dtype or not w.is_contiguous() for w in weights)
        or weights[-1].shape[1] % inter
    ):
        return None
    ins, down = slot_views(weights[:-1], weights[-1], weights[-1].shape[1] // inter)
    return (ins[0] if gated else None, ins[-1], down)
