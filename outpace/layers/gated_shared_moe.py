"""A mixture of experts beside a shared expert scaled by sigmoid(shared_expert_gate(x)), as transformers'
Qwen3NextSparseMoeBlock and Qwen2MoeSparseMoeBlock compute it: a softmax router keeps num_experts_per_tok experts
(their weights renormalised with norm_topk_prob), and the shared SwiGLU expert's output, times its gate, is
added. On the grouped kernels (layers/moe_kernels.py) the shared expert runs as more slots of the routed
experts, weighted by its gate, which the routing kernel computes as one more router row
(``RouterWithSharedGate``): the block is its router's two launches, gate/up, down and the combine. Tensor
parallelism as layers/moe.py's (every expert's rows split, the shared expert's too, its scalar gate whole).
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import build_group
from outpace.layers.decoder import GatedMLP
from outpace.layers.linear import linear
from outpace.layers.moe import (
    ExpertActivation,
    FusedShared,
    ReadyStream,
    RoutedExperts,
    RowNorm,
    expert_modules,
    experts_and_beside,
    experts_on_kernels,
    takes_normed_rows,
)
from outpace.layers.recurrent import rows_alone
from outpace.layers.router import Router, Routing


class RouterWithSharedGate(Router):
    """The router of a mixture with a gated shared expert, on the kernels with the shared expert's gate as one more row of its weight
    (layers/moe_routing_kernel.py ``shared_gate``): routing for ``num_shared`` fused shared slots weights
    them sigmoid(shared_expert_gate(x)), after the top_k weights ([n, top_k + num_shared]). ``rows``
    [experts + 1, hidden] float32 is built after loading (``pack``); without it, without shared slots and
    on the torch path it routes as ``Router``."""

    rows: torch.Tensor | None = None

    def pack(self, shared_gate: nn.Linear) -> None:
        """``rows``: the weight, now a view of its first rows, and a float32 copy of the gate's row (a copy:
        the gate keeps the model's dtype; nothing writes the weights after loading)."""
        self.rows = torch.cat([self.weight.data, shared_gate.weight.data.float()])
        self.weight.data = self.rows[:-1]

    def route_on_kernels(
        self, x: torch.Tensor, num_shared: int, layout: bool, row_norm: RowNorm | None = None
    ) -> tuple:
        if not num_shared or self.rows is None:
            return super().route_on_kernels(x, num_shared, layout, row_norm)
        from outpace.layers import moe_routing_kernel  # Triton: CUDA installs only

        return moe_routing_kernel.route(
            x,
            self.rows,
            None,
            self.routing,
            num_shared,
            layout,
            shared_gate=True,
            row_norm=row_norm,
        )


class SparseMoeWithSharedExpert(nn.Module):
    """The mixture with a gated shared expert (module docstring): [n, hidden] -> [n, hidden]. Checkpoint names:
    ``gate.weight``, ``experts.{e}.{gate,up,down}_proj``, ``shared_expert.*``, ``shared_expert_gate.weight``."""

    def __init__(
        self, hidden_size: int, routing: Routing, expert_size: int, shared_size: int, act: str
    ) -> None:
        super().__init__()
        self.group = build_group()
        self.gate = RouterWithSharedGate(hidden_size, routing)
        num_experts = routing.num_experts
        experts = expert_modules(
            num_experts,
            lambda: GatedMLP(
                hidden_size,
                expert_size,
                act,
                reduce=False,
                what="moe_intermediate_size",
            ),
        )  # (this rank's experts, whole, under expert parallelism)
        self.experts = RoutedExperts(ExpertActivation(act), experts, num_experts=num_experts)
        self.shared_expert = GatedMLP(
            hidden_size,
            shared_size,
            act,
            reduce=False,
            what="shared_expert_intermediate_size",
        )
        self.shared_expert_gate = linear(hidden_size, 1)

    def pack_rows(self) -> None:
        """After loading (layers/decoder.py ``pack_projections``): the router's rows and the shared gate's
        as one matrix, where the gate is a plain projection (not one stored quantized)."""
        if isinstance(self.shared_expert_gate, nn.Linear) and self.gate.rows is None:
            self.gate.pack(self.shared_expert_gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.partial(x), self.group)

    def partial(
        self, x: torch.Tensor, ready: ReadyStream | None = None, row_norm: RowNorm | None = None
    ):
        """This rank's part of ``forward``'s output: every expert's rows split over the ranks (layers/moe.py
        MoE), so the block's output is the sum of the ranks' parts; with ``ready`` added to a stream and
        made ready for the next norm (``NormedRows``); with ``row_norm`` x is a stream times the norm's
        weight (``takes_normed_rows``)."""
        if self.experts.uses_kernels(x):
            return self._on_kernels(x, ready, row_norm)
        out = self.experts(x, *self.gate(x)) + self._gated_shared(x)
        return out if ready is None else ready.add(out)

    def takes_normed_rows(self, x: torch.Tensor) -> bool:
        """Whether ``partial`` takes x [n, hidden] as a stream made ready for its norm (``RowNorm``): the
        routing kernel weighting the fused shared slots by the shared gate, and layers/moe.py
        ``takes_normed_rows`` (the shared expert fused: beside the experts its gate reads x itself)."""
        return (
            self.gate.rows is not None
            and FusedShared.of(self.shared_expert, self.experts).count > 0
            and takes_normed_rows(self.gate, self.experts, None, x)
        )

    def _gated_shared(self, x: torch.Tensor) -> torch.Tensor:
        # (the gates [n, 1] a token at a time in batch-invariant mode on the CPU: layers/recurrent.py rows_alone)
        return rows_alone(torch.sigmoid, self.shared_expert_gate(x)) * self.shared_expert(x)

    def _on_kernels(self, x: torch.Tensor, ready: ReadyStream | None, row_norm: RowNorm | None):
        """The routed experts on the grouped kernels and the shared expert fused with them, its slots
        weighted by its gate (``RouterWithSharedGate``), where it fuses (layers/moe.py ``FusedShared``;
        routing on the kernels, the rows packed); else beside them."""
        fuses = self.gate.rows is not None and self.gate.uses_kernel(x)
        fused = FusedShared.of(self.shared_expert if fuses else None, self.experts)
        if fused.count:
            return experts_on_kernels(
                x, self.gate, self.experts, fused, ready=ready, row_norm=row_norm
            )
        if row_norm is not None:
            raise ValueError("a shared expert beside the experts reads x normalised")
        return experts_and_beside(
            x, self.gate, self.experts, lambda: self._gated_shared(x), ready=ready
        )
