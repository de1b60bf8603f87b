"""Linear projections.

A thin alias today; tensor parallelism will add column- and row-parallel variants here with
the same constructor signature, so models never change when TP arrives.
"""
from __future__ import annotations

from torch import nn


def linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=bias)
