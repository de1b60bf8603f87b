"""The gated delta rule in chunks, in torch, for training hybrid targets on a CPU.

Serving runs the delta rule one token at a time (layers/gated_deltanet.py ``gated_delta_rule_run``: a torch
loop on the CPU), which under autograd costs thousands of small operations per window. Training forwards
keep no per-token state, so this computes the same function over chunks of ``CHUNK`` tokens with matrix
products, the form of flash-linear-attention's ``chunk_gated_delta_rule`` (Yang, Kautz, Hatamizadeh, "Gated
Delta Networks", arXiv 2412.06464, section 3.3; the WY form of Yang et al., arXiv 2406.06484).

Per token the loop does S <- a_t S, then S <- S + k_t u_t^T with u_t = beta_t (v_t - S^T k_t), o_t = S^T q_t
(a_t = exp(g_t)). Within a chunk starting from state S_0, with G_t = g_1 + ... + g_t:

    S_t = exp(G_t) S_0 + sum_{i <= t} exp(G_t - G_i) k_i u_i^T
    u_t = beta_t v_t - beta_t exp(G_t) S_0^T k_t - sum_{i < t} beta_t exp(G_t - G_i) (k_t . k_i) u_i

so (I + A) U = beta V - (beta exp(G) K) S_0 with A[t, i] = beta_t exp(G_t - G_i) (k_t . k_i) for i < t: one
unit lower-triangular solve per chunk gives every u_t, independent of S_0 but for a matrix product. Then
o_t = exp(G_t) q_t^T S_0 + sum_{i <= t} exp(G_t - G_i) (q_t . k_i) u_i, and the chunk's last S_t is the next
chunk's S_0. Only that hand-over runs in order (len / CHUNK steps). exp is only taken of G_t - G_i with
i <= t (<= 0), so strong decays underflow to 0 and never overflow.

``chunked_delta_rule()`` makes gated DeltaNet layers take this form, inside the ``with`` block, for forwards
without recurrent metadata (training's dense forwards: each sequence from zeros, nothing kept); the engine's
forwards (prefill, verify, trees) keep the per-token loop, so serving is unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from outpace.attention.context import get_forward_context
from outpace.layers import gated_deltanet
from outpace.layers.gated_deltanet import l2_normalize

CHUNK = 64


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gated_delta_rule_run``'s function for a chain keeping no per-token state (module docstring).

    q, k [runs, len, k_heads, k_dim] (not yet normalised); v [runs, len, v_heads, v_dim]; g (log decay), beta
    [runs, len, v_heads]; state [runs, v_heads, k_dim, v_dim]; valid [runs, len] (padding keeps the state:
    decay 1, no update) -> (o [runs, len, v_heads, v_dim] in v's dtype, the state after each run, float32)."""
    out_dtype = v.dtype
    runs, length, v_heads = g.shape
    repeat = v_heads // q.shape[2]
    q, k = (l2_normalize(x.float()).repeat_interleave(repeat, dim=2) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    keep = valid[:, :, None]
    g, beta = torch.where(keep, g.float(), 0.0), torch.where(keep, beta.float(), 0.0)
    pad = -length % chunk
    n = (length + pad) // chunk

    def chunks(
        x: torch.Tensor,
    ) -> torch.Tensor:  # [runs, len, heads, ...] -> [runs, heads, n, chunk, ...]
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        return x.view(runs, n, chunk, v_heads, *x.shape[3:]).transpose(1, 3).transpose(2, 3)

    q, k, v, g, beta = chunks(q), chunks(k), chunks(v.float()), chunks(g), chunks(beta)
    G = g.cumsum(-1)  # [runs, heads, n, chunk]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=g.device).tril()
    decay = torch.exp(
        torch.where(causal, G[..., :, None] - G[..., None, :], float("-inf"))
    )  # [.., t, i]
    A = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(chunk, device=g.device)
    values = torch.linalg.solve_triangular(
        eye + A, beta[..., None] * v, upper=False, unitriangular=True
    )
    keys = torch.linalg.solve_triangular(
        eye + A, (beta * G.exp())[..., None] * k, upper=False, unitriangular=True
    )
    scores = decay * (q @ k.transpose(-1, -2))  # [.., t, i], zero above the diagonal
    q_start = q * G.exp()[..., None]  # reads S_0
    k_end = k * (G[..., -1:] - G).exp()[..., None]  # writes the chunk's last state
    s = state.float()  # [runs, heads, k_dim, v_dim]
    outs = []
    for c in range(n):
        u = values[:, :, c] - keys[:, :, c] @ s  # [runs, heads, chunk, v_dim]
        outs.append(q_start[:, :, c] @ s + scores[:, :, c] @ u)
        s = G[:, :, c, -1, None, None].exp() * s + k_end[:, :, c].transpose(-1, -2) @ u
    o = torch.stack(outs, dim=2).transpose(1, 3).transpose(1, 2)  # [runs, n, chunk, heads, v_dim]
    return o.reshape(runs, n * chunk, v_heads, -1)[:, :length].to(out_dtype), s


@contextmanager
def chunked_delta_rule_in_training():
    """Inside the block, gated DeltaNet forwards without recurrent metadata take ``chunked_delta_rule``
    (module docstring); every other forward runs as served."""
    served = gated_deltanet.gated_delta_rule_run

    def run(q, k, v, g, beta, state, valid, parents, keep_every, kernel=None):
        if get_forward_context().recurrent is None and parents is None and not keep_every:
            return (*chunked_delta_rule(q, k, v, g, beta, state, valid), None)
        return served(q, k, v, g, beta, state, valid, parents, keep_every, kernel)

    gated_deltanet.gated_delta_rule_run = run
    try:
        yield
    finally:
        gated_deltanet.gated_delta_rule_run = served
