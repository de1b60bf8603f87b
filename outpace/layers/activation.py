"""Gated activations: act(gate) * up, for every parameter-free activation transformers' ``ACT2FN``
offers (transformers/activations.py; the formulas below follow its classes)."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def _gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    # transformers NewGELUActivation / AccurateGELUActivation / GELUTanh(use_gelu_tanh_python=True)
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def _laplace(x: torch.Tensor) -> torch.Tensor:
    # transformers LaplaceActivation: mu = 0.707107, sigma = 0.282095
    return 0.5 * (1.0 + torch.erf((x - 0.707107).div(0.282095 * math.sqrt(2.0))))


# hidden_act -> the function ACT2FN[hidden_act] computes. Not here: "prelu" and "xielu", which carry
# learned parameters of their own (ModelConfig refuses them).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_python": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_10": lambda x: torch.clip(F.gelu(x), -10, 10),  # ClippedGELUActivation(-10, 10)
    "gelu_new": _gelu_tanh_formula,
    "gelu_accurate": _gelu_tanh_formula,
    "gelu_python_tanh": _gelu_tanh_formula,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: (
        0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
    ),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "relu2": lambda x: torch.square(F.relu(x)),
    "relu6": F.relu6,
    "leaky_relu": F.leaky_relu,  # nn.LeakyReLU(): slope 0.01
    "hardswish": F.hardswish,
    "mish": F.mish,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "linear": lambda x: x,
    "laplace": _laplace,
    "sqrtsoftplus": lambda x: F.softplus(x).sqrt(),
}


# the names of one formula, transformers' GELU-tanh: the gate activation the fused kernels offer beside SiLU
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_python_tanh", "gelu_accurate", "gelu_fast")
FUSED_ACTIVATIONS = ("silu", "swish") + GELU_TANH


def act_and_mul(act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ACTIVATIONS[act](gate) * up, both [..., intermediate]; SiLU on CUDA is one Triton kernel."""
    if act == "silu" or act == "swish":
        return silu_and_mul(gate, up)
    return ACTIVATIONS[act](gate) * up


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, both [..., intermediate]; on CUDA one Triton kernel."""
    if gate.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
        from outpace.layers.fused_kernels import silu_and_mul_triton

        return silu_and_mul_triton(gate, up)
    return silu_and_mul_torch(gate, up)


def silu_and_mul_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The reference (the CPU path, and what ``silu_and_mul_triton`` computes)."""
    return F.silu(gate) * up
