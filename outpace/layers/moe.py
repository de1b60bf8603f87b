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

The routed experts run in ``run_experts`` (eager: the tokens sorted by expert, one call per expert in use,
one host synchronisation for the counts) or, on CUDA, in the grouped-expert kernels of layers/moe_kernels.py
(no host synchronisation, so a forward can be captured in a CUDA graph): ``MoE`` chooses.
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
    ``shared_experts.{gate,up,down}_proj``.

    On CUDA, with SiLU experts, the routed experts run in the grouped kernels (layers/moe_kernels.py) over
    the experts' weights stacked by ``stacked_experts``; elsewhere in ``run_experts``."""

    def __init__(self, hidden_size: int, routing: Routing, expert_size: int, num_shared: int,
                 make_mlp: Callable[[int, bool], nn.Module], shared_bias: bool = False) -> None:
        """``make_mlp(intermediate_size, bias)``: a gate/up/down SwiGLU MLP (the model family's); the routed
        experts have ``expert_size`` and no biases, the shared experts are one MLP of num_shared * expert_size
        (transformers DeepseekV2Moe: biases there only with the config's mlp_bias)."""
        super().__init__()
        self.gate = Router(hidden_size, routing)
        self.experts = nn.ModuleList(make_mlp(expert_size, False) for _ in range(routing.num_experts))
        self.shared_experts = make_mlp(expert_size * num_shared, shared_bias) if num_shared else None
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        if x.is_cuda and self.experts[0].act in ("silu", "swish"):
            from outpace.layers.moe_kernels import grouped_swiglu_experts  # Triton: CUDA installs only

            out = grouped_swiglu_experts(x, weights, ids, *self.stacked_experts())
        else:
            out = run_experts(x, weights, ids, self.experts)
        return out if self.shared_experts is None else out + self.shared_experts(x)

    def stacked_experts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The routed experts' weights as gate/up [experts, 2 * expert_size, hidden] (gate rows first) and
        down [experts, hidden, expert_size], for the grouped kernels.

        Built on first use: the weights are copied into the two stacked tensors and every expert's
        parameters (and its packed gate/up, layers/decoder.py PackedProjection) become views of them, so no
        memory is added and in-place changes to the parameters (loading, optimiser steps) reach the kernels.
        Rebuilt when a parameter has been given other storage since (``Module.to``, ``load_state_dict``
        with assign)."""
        first = self.experts[0]
        if self._stacked is not None and first.down_proj.weight.data_ptr() == self._stacked[1].data_ptr() \
                and first.gate_proj.weight.data_ptr() == self._stacked[0].data_ptr():
            return self._stacked
        # Plain tensors even inside inference mode: the parameters become views of them.
        with torch.no_grad(), torch.inference_mode(False):
            gate_up = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in self.experts])
            down = torch.stack([e.down_proj.weight for e in self.experts])
            size = first.gate_proj.weight.shape[0]
            for e, expert in enumerate(self.experts):
                expert.gate_proj.weight.data = gate_up[e, :size]
                expert.up_proj.weight.data = gate_up[e, size:]
                expert.down_proj.weight.data = down[e]
                if getattr(expert, "gate_up", None) is not None:
                    expert.gate_up.weight = gate_up[e]
        self._stacked = (gate_up, down)
        return self._stacked
