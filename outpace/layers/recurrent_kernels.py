"""The recurrences of gated DeltaNet (layers/gated_deltanet.py) and Mamba2 (layers/mamba2.py) as Triton
kernels for the GPU: one launch per layer and forward, whatever the number of tokens, in place of the torch
loop's few operations per token (which stays the CPU path and the reference: tests/kernels/test_hybrid_kernels.py).

Each program keeps one block of one head's state in registers for one run of tokens (layers/recurrent.py
``TokenRuns``) and walks the run token by token, the structure of flash-linear-attention's
``fused_recurrent_gated_delta_rule`` and mamba_ssm's ``selective_state_update``; grids and loop bounds come
from shapes only (no host sync), so the kernels run inside the captured decode step. They serve prefill
chunks, decode and verify alike:
- a chain: padding tokens (``valid`` False) leave the state alone; with ``keep_every`` the state after each
  token is written out (a verify's snapshot rows, one per verified position);
- a tree (``parents``): token t starts from its parent's state (the run's start state for -1), read back
  from the per-token states this program wrote (a barrier between the write and any later read).
Inputs are float32 and already prepared by the layer (normalised, gated, discretised); grouped heads are
read through ``repeat`` (value / SSM head h reads key / group head h // repeat), never copied."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _delta_rule_kernel(
    q,
    k,
    v,
    decay,
    beta,
    state,
    valid,
    parents,
    out,
    final,
    every,
    length,
    k_heads,
    v_heads,
    repeat,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    TREE: tl.constexpr,
    KEEP: tl.constexpr,
):
    r, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kh = h // repeat
    ks = tl.arange(0, BK)
    vs = vb * BV + tl.arange(0, BV)
    km, vm = ks < DK, vs < DV
    m2 = km[:, None] & vm[None, :]
    tile = ks[:, None] * DV + vs[None, :]  # [BK, BV] within [DK, DV]
    start = state + (r * v_heads + h) * DK * DV + tile
    s = tl.load(start, mask=m2, other=0.0)
    for t in range(length):
        row = r * length + t  # the token's flat run index
        if TREE:
            p = tl.load(parents + row)
            parent = every + ((r * length + p) * v_heads + h) * DK * DV + tile
            s = tl.load(tl.where(p < 0, start, parent), mask=m2, other=0.0)
        g = tl.load(decay + row * v_heads + h)
        b = tl.load(beta + row * v_heads + h)
        kt = tl.load(k + (row * k_heads + kh) * DK + ks, mask=km, other=0.0)
        qt = tl.load(q + (row * k_heads + kh) * DK + ks, mask=km, other=0.0)
        vt = tl.load(v + (row * v_heads + h) * DV + vs, mask=vm, other=0.0)
        sn = s * g
        delta = (vt - tl.sum(sn * kt[:, None], axis=0)) * b  # [BV]
        sn = sn + kt[:, None] * delta[None, :]
        tl.store(out + (row * v_heads + h) * DV + vs, tl.sum(sn * qt[:, None], axis=0), mask=vm)
        if KEEP:
            tl.store(every + (row * v_heads + h) * DK * DV + tile, sn, mask=m2)
        if TREE:
            tl.debug_barrier()  # later tokens read this state back from memory
            s = sn
        else:
            s = tl.where(tl.load(valid + row) != 0, sn, s)
    tl.store(final + (r * v_heads + h) * DK * DV + tile, s, mask=m2)


@triton.jit
def _ssm_kernel(
    x,
    dt,
    decay,
    B,
    C,
    D,
    state,
    valid,
    parents,
    y,
    final,
    every,
    length,
    heads,
    groups,
    repeat,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    TREE: tl.constexpr,
    KEEP: tl.constexpr,
):
    r, h, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    gh = h // repeat
    ps = pb * BP + tl.arange(0, BP)
    ns = tl.arange(0, BN)
    pm, nm = ps < P, ns < N
    m2 = pm[:, None] & nm[None, :]
    tile = ps[:, None] * N + ns[None, :]  # [BP, BN] within [P, N]
    start = state + (r * heads + h) * P * N + tile
    s = tl.load(start, mask=m2, other=0.0)
    d_skip = tl.load(D + h)
    for t in range(length):
        row = r * length + t
        if TREE:
            p = tl.load(parents + row)
            parent = every + ((r * length + p) * heads + h) * P * N + tile
            s = tl.load(tl.where(p < 0, start, parent), mask=m2, other=0.0)
        a = tl.load(decay + row * heads + h)
        step = tl.load(dt + row * heads + h)
        xt = tl.load(x + (row * heads + h) * P + ps, mask=pm, other=0.0)
        bt = tl.load(B + (row * groups + gh) * N + ns, mask=nm, other=0.0)
        ct = tl.load(C + (row * groups + gh) * N + ns, mask=nm, other=0.0)
        sn = s * a + (step * xt)[:, None] * bt[None, :]
        tl.store(
            y + (row * heads + h) * P + ps, tl.sum(sn * ct[None, :], axis=1) + d_skip * xt, mask=pm
        )
        if KEEP:
            tl.store(every + (row * heads + h) * P * N + tile, sn, mask=m2)
        if TREE:
            tl.debug_barrier()
            s = sn
        else:
            s = tl.where(tl.load(valid + row) != 0, sn, s)
    tl.store(final + (r * heads + h) * P * N + tile, s, mask=m2)


def _block(dim: int, cap: int) -> int:
    return min(cap, triton.next_power_of_2(dim))


def _per_token_states(state: torch.Tensor, length: int, needed: bool) -> torch.Tensor:
    """[runs, len, *state] float32 for the state after each token (a tree needs it as scratch), else a stub."""
    if not needed:
        return state.new_empty(1)
    return state.new_empty(state.shape[0], length, *state.shape[1:])


def delta_rule_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
    parents: torch.Tensor | None,
    keep_every: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The delta rule (layers/gated_deltanet.py) over runs, float32 throughout: q (normalised and scaled), k
    (normalised) [runs, len, k_heads, k_dim]; v [runs, len, v_heads, v_dim]; decay (exp(g)), beta [runs, len,
    v_heads]; state [runs, v_heads, k_dim, v_dim]; valid [runs, len]; parents [runs, len] or None -> (o [runs,
    len, v_heads, v_dim], the state after each run (a tree: after its last node), the state after every
    token or None)."""
    runs, length, k_heads, dk = q.shape
    v_heads, dv = v.shape[2:]
    tree = parents is not None
    out = v.new_empty(runs, length, v_heads, dv)
    final = state.new_empty(
        state.shape
    )  # contiguous, as the kernel writes it (state may be a strided view)
    every = _per_token_states(state, length, tree or keep_every)
    bk, bv = triton.next_power_of_2(dk), _block(dv, 32)
    if runs and length:
        _delta_rule_kernel[(runs, v_heads, triton.cdiv(dv, bv))](
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            decay.contiguous(),
            beta.contiguous(),
            state.contiguous(),
            valid.to(torch.int8).contiguous(),
            parents.contiguous() if tree else valid,
            out,
            final,
            every,
            length,
            k_heads,
            v_heads,
            v_heads // k_heads,
            DK=dk,
            DV=dv,
            BK=bk,
            BV=bv,
            TREE=tree,
            KEEP=tree or keep_every,
        )
    return out, final, every if keep_every else None


def ssm_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    decay: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
    parents: torch.Tensor | None,
    keep_every: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Mamba2's selective scan (layers/mamba2.py) over runs, float32 throughout: x [runs, len, heads,
    head_dim]; dt, decay (exp(dt A)) [runs, len, heads]; B, C [runs, len, groups, state_size]; D [heads];
    state [runs, heads, head_dim, state_size]; valid, parents as ``delta_rule_scan`` -> (y, the state after
    each run, the state after every token or None)."""
    runs, length, heads, p = x.shape
    groups, n = B.shape[2:]
    tree = parents is not None
    y = x.new_empty(
        x.shape
    )  # contiguous, as the kernel writes it (x may be a permuted view: empty_like keeps that)
    final = state.new_empty(
        state.shape
    )  # contiguous, as the kernel writes it (state may be a strided view)
    every = _per_token_states(state, length, tree or keep_every)
    bp, bn = _block(p, 32), triton.next_power_of_2(n)
    if runs and length:
        _ssm_kernel[(runs, heads, triton.cdiv(p, bp))](
            x.contiguous(),
            dt.contiguous(),
            decay.contiguous(),
            B.contiguous(),
            C.contiguous(),
            D.contiguous(),
            state.contiguous(),
            valid.to(torch.int8).contiguous(),
            parents.contiguous() if tree else valid,
            y,
            final,
            every,
            length,
            heads,
            groups,
            heads // groups,
            P=p,
            N=n,
            BP=bp,
            BN=bn,
            TREE=tree,
            KEEP=tree or keep_every,
        )
    return y, final, every if keep_every else None
