"""Gated activations: act(gate) * up, for every parameter-free activation transformers' ``ACT2FN``
offers (transformers/activations.py; the formulas below follow its classes), and the attention output
gate x * sigmoid(gate). SwiGLU, relu2 and the sigmoid gate are one Triton kernel each on CUDA
(layers/fused_kernels.py), their torch references here."""

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


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 (transformers ReLUSquaredActivation), x [..., width]; on CUDA one Triton kernel."""
    if x.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
        from outpace.layers.fused_kernels import relu2_triton

        return relu2_triton(x)
    return relu2_torch(x)


def relu2_torch(x: torch.Tensor) -> torch.Tensor:
    """The reference (the CPU path, and what ``relu2_triton`` computes)."""
    return torch.square(F.relu(x))


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
    "relu2": relu2,
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
SILU = ("silu", "swish")  # the names of SiLU
FUSED_ACTIVATIONS = SILU + GELU_TANH


def act_and_mul(act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ACTIVATIONS[act](gate) * up, both [..., intermediate]; SiLU on CUDA is one Triton kernel."""
    if act in SILU:
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


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """An attention output gate: x [n, heads, head_dim] times sigmoid(gate), gate [n, heads, head_dim]
    (Qwen3-Next) or [n, heads, 1] (one value per head: Step-3.5), of x's dtype or float32 (a fused
    projection's products) -> [n, heads, head_dim] in x's dtype; on CUDA one Triton kernel that reads the
    gate where the projection left it (strided)."""
    if x.is_cuda and not torch.is_grad_enabled():  # the Triton kernel has no backward
        from outpace.layers.fused_kernels import sigmoid_gate_triton

        return sigmoid_gate_triton(x, gate)
    return sigmoid_gate_torch(x, gate)


def sigmoid_gate_torch(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The reference (the CPU path, and what ``sigmoid_gate_triton`` computes). The sigmoid runs over a
    contiguous copy of the gate: torch's CPU kernel rounds exp differently in its vectorised and scalar
    loops, so a strided gate (a view of a packed projection) would change the last bits."""
    return (x * torch.sigmoid(gate.contiguous())).to(x.dtype)
