"""The recurrences' chunked forms for long runs on the GPU (prefill chunks), from flash-linear-attention.

A per-token scan (layers/recurrent_kernels.py) walks a run one token at a time: right for a verify, which
needs the state after every token anyway, and slow for a prompt of thousands. flash-linear-attention's
chunked kernels (the ``fla-core`` package: ``fla.ops``) split a run into chunks of 64, compute each chunk's
outputs with matrix products and carry the state across chunk edges, so the work is dense and parallel:

- the gated delta rule (layers/gated_deltanet.py) is ``chunk_gated_delta_rule`` (its state [heads, k_dim,
  v_dim] is ours; value heads grouped over key heads are its GVA);
- Mamba2's scan (layers/mamba2.py) is simple gated linear attention, ``chunk_simple_gla``, with
  query = C, key = B, value = dt * x and log-decay g = dt * A per head, plus the skip D * x (the SSD
  duality of the Mamba2 paper); its state is ours with ``state_v_first`` ([head_dim, state_size]).

Precision: the chunks' matrix products take float32 inputs as TF32 (Triton's default for ``tl.dot``), so
single outputs differ from the per-token kernel's by up to ~3e-2 at unit scale (relative error of a whole
tensor ~1e-3; tests/kernels/test_hybrid_kernels.py); the state is carried in float32.

Both only take a run's state at its start and give it at its end, so they serve runs that keep no
per-token state (no tree, no verify). A padding position of a run keeps the state exactly, whatever its
inputs (a captured prefill's padding rows hold what the layer before left there, NaN possibly): its decay is
exp(0) = 1 and its key and update are zero (k, v and beta for the delta rule, B and the value for the scan);
its output is discarded by the caller.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

# Runs shorter than this stay on the per-token kernel (a verify's few tokens; a short prompt's tail).
CHUNKED_MIN_LEN = 64


def use_chunked(
    x: torch.Tensor, length: int, parents: torch.Tensor | None, keep_every: bool
) -> bool:
    """Whether a run batch goes through the chunked kernels: on CUDA, long, a chain keeping no per-token
    state, and flash-linear-attention installed (a dependency of outpace; without it the per-token kernel
    computes the same function)."""
    return (
        x.is_cuda
        and length >= CHUNKED_MIN_LEN
        and parents is None
        and not keep_every
        and _fla_installed()
    )


@functools.cache
def _fla_installed() -> bool:
    """Looked up once (every layer of every long prefill asks)."""
    return importlib.util.find_spec("fla") is not None


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (normalised and scaled), k (normalised) [runs, len, k_heads, k_dim]; v [runs, len, v_heads, v_dim];
    g (log decay), beta [runs, len, v_heads]; state [runs, v_heads, k_dim, v_dim]; valid [runs, len] ->
    (o [runs, len, v_heads, v_dim], the state after each run's last valid token), float32."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    keep = valid[:, :, None]
    o, final = chunk_gated_delta_rule(
        q,
        torch.where(keep[..., None], k, 0.0),
        torch.where(keep[..., None], v, 0.0),
        torch.where(keep, g, 0.0),
        torch.where(keep, beta, 0.0),
        scale=1.0,
        initial_state=state.contiguous(),
        output_final_state=True,
    )
    return o, final


def ssm_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [runs, len, heads, head_dim]; dt [runs, len, heads]; A, D [heads]; B, C [runs, len, groups,
    state_size]; state [runs, heads, head_dim, state_size]; valid [runs, len] -> (y [runs, len, heads,
    head_dim], the state after each run's last valid token), float32."""
    from fla.ops.simple_gla import chunk_simple_gla

    repeat = x.shape[2] // B.shape[2]
    B, C = (t.repeat_interleave(repeat, dim=2) for t in (B, C))  # [runs, len, heads, state_size]
    keep = valid[:, :, None]
    g = torch.where(keep, dt * A, 0.0)  # [runs, len, heads]
    value = torch.where(keep[..., None], dt[..., None] * x, 0.0)  # [runs, len, heads, head_dim]
    y, final = chunk_simple_gla(
        C.contiguous(),
        torch.where(keep[..., None], B, 0.0),
        value,
        g=g,
        scale=1.0,
        initial_state=state.contiguous(),
        output_final_state=True,
        state_v_first=True,
    )
    return y + D[:, None] * x, final
