"""Mixture of experts as DeepSeek-V2 and V3 define it: a router scores every routed expert for each
token, keeps ``top_k`` of them (optionally only within the best expert groups), and the layer's output is
the routed experts' SwiGLU outputs weighted by the router, plus the shared experts' output.

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

The routed experts run in ``run_experts``: the one function a grouped-expert kernel replaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Routing:
    """How a router turns logits into (weights, experts) per token (module docstring)."""

    num_experts: int
    top_k: int
    scoring: str                   # "softmax" or "sigmoid"
    num_groups: int = 1            # n_group (1: no group limit)
    top_groups: int = 1            # topk_group
    group_score: str = "max"       # "max" (V2) or "top2_sum" (V3): how a group is scored
    correction_bias: bool = False  # V3's e_score_correction_bias, added for selection only
    normalize: bool = False        # norm_topk_prob
    scaling: float = 1.0           # routed_scaling_factor


class Router(nn.Module):
    """hidden [n, hidden] -> (weights [n, top_k] float32, expert ids [n, top_k] int64). Its weight and the
    correction bias stay float32 whatever the model's dtype (transformers keeps both in float32:
    DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict)."""

    def __init__(self, hidden_size: int, routing: Routing) -> None:
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(torch.empty(routing.num_experts, hidden_size, dtype=torch.float32))
        if routing.correction_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(routing.num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.routing
        logits = F.linear(x.float(), self.weight.float())                       # [n, experts]
        scores = logits.softmax(dim=-1) if r.scoring == "softmax" else logits.sigmoid()
        choice = scores + self.e_score_correction_bias if r.correction_bias else scores
        if r.num_groups > 1:
            choice = _limit_to_top_groups(choice, r)
        ids = torch.topk(choice, r.top_k, dim=-1, sorted=False).indices        # [n, top_k]
        weights = scores.gather(1, ids)                                         # [n, top_k]
        if r.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * r.scaling, ids


def _limit_to_top_groups(choice: torch.Tensor, r: Routing) -> torch.Tensor:
    """choice [n, experts] -> the same with every expert outside the ``top_groups`` best groups at -inf."""
    grouped = choice.view(choice.shape[0], r.num_groups, -1)                    # [n, groups, experts per group]
    if r.group_score == "max":
        group_scores = grouped.max(dim=-1).values                               # [n, groups]
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    top = torch.topk(group_scores, r.top_groups, dim=-1, sorted=False).indices  # [n, top_groups]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top, True)
    return grouped.masked_fill(~keep[:, :, None], float("-inf")).view_as(choice)


def run_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: nn.ModuleList) -> torch.Tensor:
    """x [n, hidden]; weights [n, top_k] float32; ids [n, top_k] -> sum over j of weights[:, j] times
    expert ids[:, j] applied to x: [n, hidden] in x's dtype, accumulated in float32.

    The tokens are sorted by expert and each expert runs once over its rows (one host sync for the
    per-expert counts): the place a grouped-GEMM kernel takes over on the GPU."""
    top_k = ids.shape[1]
    order = ids.flatten().argsort(stable=True)                                  # [n * top_k]: (token, slot) by expert
    counts = torch.bincount(ids.flatten(), minlength=len(experts)).tolist()
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert, rows in zip(experts, order.split(counts)):
        if rows.numel():
            tokens = rows // top_k                                              # [rows]
            y = expert(x.index_select(0, tokens)).float() * weights.flatten()[rows, None]
            out.index_add_(0, tokens, y)
    return out.to(x.dtype)


class MoE(nn.Module):
    """Routed experts plus shared experts: [n, hidden] -> [n, hidden]. Checkpoint names (DeepSeek's and
    transformers'): ``gate.weight``, ``gate.e_score_correction_bias``, ``experts.{e}.{gate,up,down}_proj``,
    ``shared_experts.{gate,up,down}_proj``."""

    def __init__(self, hidden_size: int, routing: Routing, expert_size: int, num_shared: int,
                 make_mlp: Callable[[int, bool], nn.Module], shared_bias: bool = False) -> None:
        """``make_mlp(intermediate_size, bias)``: a gate/up/down SwiGLU MLP (the model family's); the routed
        experts have ``expert_size`` and no biases, the shared experts are one MLP of num_shared * expert_size
        (transformers DeepseekV2Moe: biases there only with the config's mlp_bias)."""
        super().__init__()
        self.gate = Router(hidden_size, routing)
        self.experts = nn.ModuleList(make_mlp(expert_size, False) for _ in range(routing.num_experts))
        self.shared_experts = make_mlp(expert_size * num_shared, shared_bias) if num_shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = run_experts(x, weights, ids, self.experts)
        return out if self.shared_experts is None else out + self.shared_experts(x)
