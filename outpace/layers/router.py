"""A mixture's router as DeepSeek-V2 and V3 define it (layers/moe.py holds the experts and the block): it
scores every routed expert for each token and keeps ``top_k`` of them (optionally only within the best expert
groups).

Routing, as transformers' DeepseekV2TopkRouter and DeepseekV3TopkRouter compute it (the names below are
the configs' fields):
- scores: softmax (V2) or sigmoid (V3) of the router logits, in float32;
- selection: the scores plus, for V3, ``e_score_correction_bias`` (used to *select* only: the weights are
  the uncorrected scores);
- groups (``n_group``, ``topk_group``): the experts split into n_group equal groups, each scored by its
  best expert (V2 "group_limited_greedy") or the sum of its two best (V3 "noaux_tc"); only the experts of
  the topk_group best groups can be chosen;
- weights: the chosen experts' scores, divided by their sum when ``norm_topk_prob`` (V3), then times
  ``routed_scaling_factor``.

On CUDA without autograd a router runs the routing kernels of layers/moe_routing_kernel.py; the torch code
(``Router.reference``) stays the CPU path and their reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from outpace.layers.linear import project
from outpace.layers.recurrent import rows_alone

if TYPE_CHECKING:
    from outpace.layers.moe import ExpertPlacement, RowNorm


@dataclass(frozen=True)
class Routing:
    """How a router turns logits into (weights, experts) per token (module docstring)."""

    num_experts: int
    top_k: int
    scoring: str  # "softmax" or "sigmoid"
    num_groups: int = 1  # n_group (1: no group limit)
    top_groups: int = 1  # topk_group
    group_score: str = "max"  # "max" (V2) or "top2_sum" (V3): how a group is scored
    correction_bias: bool = False  # V3's e_score_correction_bias, added for selection only
    normalize: bool = False  # norm_topk_prob
    scaling: float = 1.0  # routed_scaling_factor


class RoutingModule(nn.Module):
    """A router: hidden [n, hidden] -> (weights [n, top_k] float32, expert ids [n, top_k] int64). On CUDA
    without autograd the routing kernels of layers/moe_routing_kernel.py (``route_on_kernels``: two
    launches, no host synchronisation; ties go to the lowest expert index); elsewhere ``reference``, the
    torch code. DeepSeek's ``Router`` below; Gemma 4's norm-and-scale router (models/gemma4.py)."""

    # the routing kernels: None on CUDA tensors without autograd, True / False forces either (tests)
    kernel: bool | None = None

    def forward(
        self,
        x: torch.Tensor,
        num_shared: int = 0,
        layout: bool | ExpertPlacement = False,
        row_norm: RowNorm | None = None,
    ) -> tuple:
        """x [n, hidden] -> (weights, ids); with ``layout`` (weights, ids, block layout or None): the routing
        kernel also writes the grouped-expert kernels' block layout of ids and ``num_shared`` shared slots
        per token (layers/expert_blocks.py ``BlockLayout``), of every expert (True) or of an
        ``ExpertPlacement``'s (its experts' slots, its experts as indices 0 .. count - 1: an expert-parallel
        rank's, layers/moe_routing_kernel.py docstring 4.); the torch path leaves it to
        ``expert_blocks.align`` (None). The ids name every expert either way. Called as a module either way,
        so forward hooks see every routing. ``row_norm``: x is a stream times its norm's weight, the norm
        applied by the routing kernel (``RowNorm``; the kernels only)."""
        if not self.uses_kernel(x):
            if row_norm is not None:
                raise ValueError("a RowNorm input is routed by the kernels only")
            routed = self.reference(x)
            return (*routed, None) if layout else routed
        weights, ids, blocks = self.route_on_kernels(x, num_shared, layout, row_norm)
        return (weights, ids, blocks) if layout else (weights, ids)

    def uses_kernel(self, x: torch.Tensor) -> bool:
        return x.is_cuda and not torch.is_grad_enabled() if self.kernel is None else self.kernel

    def route_on_kernels(
        self,
        x: torch.Tensor,
        num_shared: int,
        layout: bool | ExpertPlacement,
        row_norm: RowNorm | None = None,
    ) -> tuple:
        """(weights, ids, block layout or None) from layers/moe_routing_kernel.py ``route`` (``forward``'s
        arguments)."""
        raise NotImplementedError

    def reference(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The routing in torch: the CPU path and the kernels' reference."""
        raise NotImplementedError


class Router(RoutingModule):
    """DeepSeek's router (module docstring). Its weight and the correction bias stay float32 whatever the
    model's dtype (transformers keeps both in float32: DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict)."""

    def __init__(self, hidden_size: int, routing: Routing) -> None:
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(
            torch.empty(routing.num_experts, hidden_size, dtype=torch.float32)
        )
        if routing.correction_bias:
            self.register_buffer(
                "e_score_correction_bias", torch.zeros(routing.num_experts, dtype=torch.float32)
            )

    def route_on_kernels(
        self,
        x: torch.Tensor,
        num_shared: int,
        layout: bool | ExpertPlacement,
        row_norm: RowNorm | None = None,
    ) -> tuple:
        from outpace.layers import moe_routing_kernel  # Triton: CUDA installs only

        bias = getattr(self, "e_score_correction_bias", None)
        return moe_routing_kernel.route(
            x, self.weight.float(), bias, self.routing, num_shared, layout, row_norm=row_norm
        )

    def reference(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The routing in torch (module docstring): the CPU path and the kernels' reference."""
        logits = project(
            x.float(), self.weight.float()
        )  # [n, experts] (a row's bits its own in the mode)
        # (in batch-invariant mode on the CPU each token alone: an element-wise op's vector loop and scalar
        # tail round differently, and where a token's scores fall between them follows the token count)
        return rows_alone(self._select, logits)

    def _select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [n, experts] float32 -> (weights, ids) [n, top_k] (module docstring)."""
        r = self.routing
        scores = logits.softmax(dim=-1) if r.scoring == "softmax" else logits.sigmoid()
        choice = scores + self.e_score_correction_bias if r.correction_bias else scores
        if r.num_groups > 1:
            choice = _limit_to_top_groups(choice, r)
        ids = torch.topk(choice, r.top_k, dim=-1, sorted=False).indices  # [n, top_k]
        weights = scores.gather(1, ids)  # [n, top_k]
        if r.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * r.scaling, ids


def _limit_to_top_groups(choice: torch.Tensor, r: Routing) -> torch.Tensor:
    """choice [n, experts] -> the same with every expert outside the ``top_groups`` best groups at -inf."""
    grouped = choice.view(choice.shape[0], r.num_groups, -1)  # [n, groups, experts per group]
    if r.group_score == "max":
        group_scores = grouped.max(dim=-1).values  # [n, groups]
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    top = torch.topk(group_scores, r.top_groups, dim=-1, sorted=False).indices  # [n, top_groups]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top, True)
    return grouped.masked_fill(~keep[:, :, None], float("-inf")).view_as(choice)
