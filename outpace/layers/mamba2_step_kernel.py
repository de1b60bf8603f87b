"""Mamba2's few-row step (decode, verify chains and trees; layers/mamba2.py ``Mamba2Mixer``) between in_proj
and out_proj as two Triton launches, in place of the eager path's few dozen torch operations per layer.

From in_proj's output row [z | x B C | dt] of each token, the eager path computes (layers/mamba2.py): the
causal convolution of x, B, C (the window of the convolution state and the run's inputs before the
token; in a tree its root path's), the activation, dt = max(softplus(dt + dt_bias), time_step_min),
the SSM update S <- S exp(dt A) + dt x B^T, y = S C + D x per head (B, C of its group), then y * silu(z)
through an RMSNorm over each group of ``heads / groups`` heads, times the norm weight. The launches:

1. ``_scan_kernel``, grid (runs, heads, head_dim blocks): a program owns one block of one head's state
   rows and walks its run token by token (layers/recurrent_kernels.py's structure): the convolution and
   activation of its x channels and of its group's B and C channels (recomputed by every head of the
   group: a few hundred multiply-adds, read from L2), dt, the state update, y in the model's dtype
   (unnormalised), and the SSM state after every token (verify snapshots; a tree's nodes read their
   parent's back) or after the run's last valid token (decode: into the state row).
2. ``_norm_kernel``, grid (runs, tokens, norm groups): a program owns one norm group of one token: the
   gated RMSNorm in place over y, and the convolution state of the group's channels (its heads' x, its
   B and C): the state after the token (verify: its snapshot row) or, in decode, the state after the
   run's last valid token, written by the program of that token.

Why the norm is a second pass: its reduction spans a group of heads (16 heads of 64 for Nemotron-H-8B),
and a program owning a whole group would leave the grid at runs * groups programs (8 per sequence),
too few to stream the 4 MiB of float32 state per sequence and layer over 132 SMs at decode's batch
sizes; the second pass reads and writes only y and z (2 * inner bytes per token). Why the convolution
state is written there: in decode the state row is read and rewritten in place, and every head of a
group reads the group's B and C window rows; written in the first launch, one head's program could
overwrite them before another has read them. After the first launch has finished no program reads the
start state any more. Each program of either launch writes bytes no other program writes (runs of
distinct state rows: the padding rows of a captured batch share one, which no request reads).

Both launches use programmatic dependent launch on Hopper (layers/pdl.py), as gated DeltaNet's step kernel does
(layers/deltanet_step_kernel.py): each loads the layer's parameters (the convolution's taps, A_log, dt_bias, D;
the norm's weight), never written while serving, before its wait, and lets the next kernel (the norm, then
out_proj, which prefetches its weights) start launching; nothing another kernel writes, index tensors
included, is read before the wait.

Rounding follows the eager path in the model's dtype (bf16): the convolution's sum and then its bias
rounded, the activation rounded, y rounded before the gate, the normalised value rounded before the
weight. Grids and loops come from shapes only (no host sync): the step runs inside captured CUDA graphs.
Padding positions (t >= the run's query length) leave the state untouched and write no output.

Batch-invariant mode (attention/context.py ``batch_invariant``): a token must get the same bits in a decode step
alone or in a batch, and in a verified chain. Gated DeltaNet's step kernel did not while each run length was its
own compilation (benchmarks/results/gpu_2026-12-03d), so in the mode both launches here take one compilation
whatever the batch and the run: the state block of a program is the one a single run takes (``_head_block``
follows the batch otherwise), the run length, the snapshot rows and the run's form (chain or tree: FORM_ARG,
``run_tree``) are arguments Triton does not specialise (``_scan_any_length``, ``_norm_any_length``: the same
kernels, launched so), and contraction is off. (The gated DeltaNet step, compiled for a tree, gave a tree node
other last bits than its path decoded on the H200: gpu_2026-12-03e call 1.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from outpace.attention.context import batch_invariant, invariant_launch_options
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options
from outpace.layers.recurrent import RecurrentMetadata
from outpace.layers.sm_count import num_sms

if TYPE_CHECKING:
    from outpace.layers.mamba2 import Mamba2Mixer


@triton.jit
def _softplus(x):
    # torch's softplus (threshold 20), written as vLLM's mamba_ssm.py (selective_state_update) writes it
    return tl.where(x <= 20.0, tl.log(tl.exp(x) + 1.0), x)


@triton.jit
def _window_rows(r, node, parents, length, ks, KEEP: tl.constexpr, tree):
    """[WB] the convolution window of ``node`` (-1 in decode with no valid token) as positions of the
    run's extended inputs [start state rows 0..KEEP-1, nodes KEEP..], oldest first (k = 0..KEEP, the
    node itself last). A chain's window is the KEEP + 1 positions ending at the node; in a tree each
    position's predecessor is its parent node (the last state row for a root; the row before for a
    state row), as layers/causal_conv.py ``_tree_conv`` gathers it. ``tree`` a constexpr, or in
    batch-invariant mode a runtime flag (both branches compiled)."""
    if tree:
        e = node + KEEP
        rows = tl.where(ks == KEEP, e, 0)
        for k in tl.static_range(KEEP):
            parent = tl.load(parents + r * length + tl.maximum(e - KEEP, 0)).to(tl.int32)
            e = tl.where(e >= KEEP, parent + KEEP, e - 1)
            rows = tl.where(ks == KEEP - 1 - k, e, rows)
    else:
        rows = node + ks
    return rows


@triton.jit
def _load_window(
    rows,
    ks,
    cols,
    cmask,
    r,
    length,
    table,
    zxbcdt,
    row_stride,
    conv_start,
    has_init,
    KEEP: tl.constexpr,
    INNER: tl.constexpr,
    CHANNELS: tl.constexpr,
):
    """[WB, BC] in the model's dtype: window ``rows`` (``_window_rows``) of convolution channels ``cols``,
    from the start state (zeros without an initial state) or from the tokens' in_proj rows (x B C start
    after z's INNER columns)."""
    live = ((ks <= KEEP) & (rows >= 0))[:, None] & cmask[None, :]
    from_state = (rows < KEEP)[:, None]
    token = tl.load(table + r * length + tl.maximum(rows - KEEP, 0), mask=ks <= KEEP, other=0)
    inputs = tl.load(
        zxbcdt + token.to(tl.int64)[:, None] * row_stride + INNER + cols[None, :],
        mask=live & ~from_state,
        other=0.0,
    )
    state = tl.load(
        conv_start + rows[:, None] * CHANNELS + cols[None, :],
        mask=live & from_state & has_init,
        other=0.0,
    )
    return tl.where(from_state, state, inputs)


@triton.jit
def _conv_silu(
    rows,
    ks,
    cols,
    cmask,
    weight,
    bias,
    r,
    length,
    table,
    zxbcdt,
    row_stride,
    conv_start,
    has_init,
    KEEP: tl.constexpr,
    INNER: tl.constexpr,
    CHANNELS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """[BC] float32: silu(sum_k weight[k] window[k] + bias) over window ``rows`` of channels ``cols``
    (weight [WB, BC] float32), rounded to the model's dtype after each step as the eager path is (its
    convolution runs in that dtype)."""
    window = _load_window(
        rows, ks, cols, cmask, r, length, table, zxbcdt, row_stride, conv_start, has_init, KEEP,
        INNER, CHANNELS,
    )  # fmt: skip
    dtype = zxbcdt.dtype.element_ty
    out = tl.sum(window.to(tl.float32) * weight, axis=0).to(dtype).to(tl.float32)
    if HAS_BIAS:
        out = (out + tl.load(bias + cols, mask=cmask).to(tl.float32)).to(dtype).to(tl.float32)
    return (out * tl.sigmoid(out)).to(dtype).to(tl.float32)


@triton.jit
def _taps(conv_weight, cols, cmask, ks, KEEP: tl.constexpr):
    """[WB, BC] float32: the convolution taps of channels ``cols`` (weight [channels, 1, KEEP + 1])."""
    mask = (ks[:, None] <= KEEP) & cmask[None, :]
    return tl.load(conv_weight + cols[None, :] * (KEEP + 1) + ks[:, None], mask=mask).to(tl.float32)


@triton.jit
def _copy_window(
    rows,
    ks,
    cols,
    cmask,
    dest,
    r,
    length,
    table,
    zxbcdt,
    row_stride,
    conv_start,
    has_init,
    KEEP: tl.constexpr,
    INNER: tl.constexpr,
    CHANNELS: tl.constexpr,
):
    """Window rows 1..KEEP (the convolution state after the window's node) of channels ``cols`` into the
    state rows at ``dest`` ([KEEP, CHANNELS])."""
    window = _load_window(
        rows, ks, cols, cmask, r, length, table, zxbcdt, row_stride, conv_start, has_init, KEEP,
        INNER, CHANNELS,
    )  # fmt: skip
    # In decode ``dest`` is the state row the window was read from: every thread's reads before any write.
    # (A window's taps may lie in other warps than the row it is written to: at 8 warps the layout of a
    # [4, 128] window split them, and decode's B and C rows came out wrong on the H200, gpu_2026-12-02 call 12.)
    tl.debug_barrier()
    kept = (ks >= 1) & (ks <= KEEP)
    out = dest + (ks[:, None] - 1) * CHANNELS + cols[None, :]
    tl.store(out, window, mask=kept[:, None] & cmask[None, :])


@triton.jit
def _scan_kernel(
    zxbcdt,
    row_stride,
    table,
    query_lens,
    state_indices,
    has_initial,
    parents,
    conv_state,
    ssm_state,
    ssm_snapshots,
    snapshot_rows,
    conv_weight,
    conv_bias,
    dt_bias,
    A_log,
    D,
    y,
    length,
    time_step_min,
    run_tree,
    HEADS: tl.constexpr,
    GROUPS: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    KEEP: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    WB: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TREE: tl.constexpr,
    FORM_ARG: tl.constexpr,  # batch-invariant mode: the run's form is ``run_tree`` (module docstring)
    SNAPSHOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    if FORM_ARG:
        tree = run_tree != 0
    else:
        tree: tl.constexpr = TREE
    r, h, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    INNER: tl.constexpr = HEADS * P
    CHANNELS: tl.constexpr = INNER + 2 * GROUPS * N
    g = h // (HEADS // GROUPS)
    ps = pb * BP + tl.arange(0, BP)
    ns = tl.arange(0, BN)
    ks = tl.arange(0, WB)
    pm, nm = ps < P, ns < N
    m2 = pm[:, None] & nm[None, :]
    tile = ps[:, None] * N + ns[None, :]  # [BP, BN] within [P, N]
    # convolution channels: this head's x, its group's B and C
    x_cols, b_cols, c_cols = h * P + ps, INNER + g * N + ns, INNER + (GROUPS + g) * N + ns
    wx = _taps(conv_weight, x_cols, pm, ks, KEEP)  # [WB, BP]
    wb = _taps(conv_weight, b_cols, nm, ks, KEEP)  # [WB, BN]
    wc = _taps(conv_weight, c_cols, nm, ks, KEEP)
    a = -tl.exp(tl.load(A_log + h).to(tl.float32))
    step_bias = tl.load(dt_bias + h).to(tl.float32)
    skip = tl.load(D + h).to(tl.float32)
    # (the parameters above are never written while serving; everything below may be)
    pdl_enter(PDL)
    slot = tl.load(state_indices + r)  # the run's state row
    has_init = tl.load(has_initial + r) != 0
    n_valid = tl.load(query_lens + r)
    conv_start = conv_state + slot * KEEP * CHANNELS
    start_row = ssm_state + (slot * HEADS + h) * P * N
    start = start_row + tile
    s = tl.load(start, mask=m2 & has_init, other=0.0)
    for t in range(length):
        valid = t < n_valid
        if tree:  # the node's start state: its parent's snapshot, or the row's at the root
            parent = tl.load(parents + r * length + t)
            snap = ssm_snapshots + ((slot * snapshot_rows + parent) * HEADS + h) * P * N
            from_start = parent < 0
            # one scalar base, then the tile's offsets (a select of two pointer tiles holds both)
            base = tl.where(from_start, start_row, snap)
            s = tl.load(base + tile, mask=m2 & (has_init | ~from_start), other=0.0)
        rows = _window_rows(r, t, parents, length, ks, KEEP, tree)
        xt = _conv_silu(  # [BP]
            rows, ks, x_cols, pm, wx, conv_bias, r, length, table, zxbcdt, row_stride, conv_start,
            has_init, KEEP, INNER, CHANNELS, HAS_BIAS,
        )  # fmt: skip
        bt = _conv_silu(  # [BN]
            rows, ks, b_cols, nm, wb, conv_bias, r, length, table, zxbcdt, row_stride, conv_start,
            has_init, KEEP, INNER, CHANNELS, HAS_BIAS,
        )  # fmt: skip
        ct = _conv_silu(  # [BN]
            rows, ks, c_cols, nm, wc, conv_bias, r, length, table, zxbcdt, row_stride, conv_start,
            has_init, KEEP, INNER, CHANNELS, HAS_BIAS,
        )  # fmt: skip
        token = tl.load(table + r * length + t).to(tl.int64)
        raw_dt = tl.load(zxbcdt + token * row_stride + INNER + CHANNELS + h).to(tl.float32)
        step = tl.maximum(_softplus(raw_dt + step_bias), time_step_min)
        sn = s * tl.exp(step * a) + (step * xt)[:, None] * bt[None, :]
        yt = tl.sum(sn * ct[None, :], axis=1) + skip * xt
        tl.store(y + token * INNER + x_cols, yt.to(y.dtype.element_ty), mask=pm & valid)
        s = tl.where(valid, sn, s)
        if SNAPSHOTS:
            snap_t = ssm_snapshots + ((slot * snapshot_rows + t) * HEADS + h) * P * N + tile
            tl.store(snap_t, s, mask=m2)
        if tree:
            tl.debug_barrier()  # later nodes read this state back
    if not SNAPSHOTS:
        tl.store(start, s, mask=m2)


@triton.jit
def _norm_kernel(
    zxbcdt,
    row_stride,
    table,
    query_lens,
    state_indices,
    has_initial,
    parents,
    conv_state,
    conv_snapshots,
    snapshot_rows,
    norm_weight,
    y,
    length,
    eps,
    run_tree,
    HEADS: tl.constexpr,
    GROUPS: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    KEEP: tl.constexpr,
    BG: tl.constexpr,
    BN: tl.constexpr,
    WB: tl.constexpr,
    TREE: tl.constexpr,
    FORM_ARG: tl.constexpr,  # as the scan kernel's
    SNAPSHOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    if FORM_ARG:
        tree = run_tree != 0
    else:
        tree: tl.constexpr = TREE
    r, t, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    INNER: tl.constexpr = HEADS * P
    CHANNELS: tl.constexpr = INNER + 2 * GROUPS * N
    SIZE: tl.constexpr = INNER // GROUPS  # a norm group: heads / groups heads
    dtype = y.dtype.element_ty
    cs, ns, ks = tl.arange(0, BG), tl.arange(0, BN), tl.arange(0, WB)
    cm, nm = cs < SIZE, ns < N
    x_cols = g * SIZE + cs
    weight = tl.load(norm_weight + x_cols, mask=cm).to(tl.float32)  # (a parameter: before the wait)
    pdl_enter(PDL)
    n_valid = tl.load(query_lens + r)
    if t < n_valid:  # y * silu(z), normalised over the group (GroupedGatedRMSNorm)
        token = tl.load(table + r * length + t).to(tl.int64)
        yv = tl.load(y + token * INNER + x_cols, mask=cm, other=0.0).to(tl.float32)
        z = tl.load(zxbcdt + token * row_stride + x_cols, mask=cm, other=0.0).to(tl.float32)
        gated = yv * (z * tl.sigmoid(z))
        rstd = 1.0 / tl.sqrt(tl.sum(gated * gated, axis=0) / SIZE + eps)
        normed = (gated * rstd).to(dtype).to(tl.float32)
        tl.store(y + token * INNER + x_cols, (weight * normed).to(dtype), mask=cm)

    slot = tl.load(state_indices + r)
    if SNAPSHOTS:  # the state after token t, into its snapshot row
        node = t
        dest = conv_snapshots + (slot * snapshot_rows + t) * KEEP * CHANNELS
        writer = True
    else:  # the state after the run's last valid token, into the state row, by that token's program
        node = n_valid - 1
        dest = conv_state + slot * KEEP * CHANNELS
        writer = t == tl.maximum(node, 0)
    if writer:
        rows = _window_rows(r, node, parents, length, ks, KEEP, tree)
        has_init = tl.load(has_initial + r) != 0
        conv_start = conv_state + slot * KEEP * CHANNELS
        b_cols, c_cols = INNER + g * N + ns, INNER + (GROUPS + g) * N + ns
        _copy_window(
            rows, ks, x_cols, cm, dest, r, length, table, zxbcdt, row_stride, conv_start, has_init,
            KEEP, INNER, CHANNELS,
        )  # fmt: skip
        _copy_window(
            rows, ks, b_cols, nm, dest, r, length, table, zxbcdt, row_stride, conv_start, has_init,
            KEEP, INNER, CHANNELS,
        )  # fmt: skip
        _copy_window(
            rows, ks, c_cols, nm, dest, r, length, table, zxbcdt, row_stride, conv_start, has_init,
            KEEP, INNER, CHANNELS,
        )  # fmt: skip


# A head's state rows a ``_scan_kernel`` program at most, and its warps. Nemotron-H-8B's decode step on the H200
# (benchmarks/scripts/decode_settings.py mamba2, gpu_2026-11-30c call 3, two passes): 64 rows against 32, b32
# 7.862 / 7.969 -> 7.786 / 7.631 ms, b8 5.829 / 5.724 -> 5.765 / 5.680, b1 unchanged; 8 or 2 warps, 16 rows: no
# gain in both passes.
max_head_block = 64
scan_warps = 4
# The norm kernel's warps: a program takes a whole norm group's channels (1024 at Nemotron-H-8B). At 4 ptxas
# spills registers in decode (its convolution window copied into the state row), at 8 it does not
# (tests/kernels/test_mamba2_step_sm90_compile.py), but 8 are not timed, nor tested on a GPU since that copy's
# barrier (``_copy_window``): 4, as every GPU run before measured it.
norm_warps = 4


# batch-invariant mode's launches (module docstring): the same kernels, the run length, the snapshot rows and the
# run's form never specialised (Triton would compile a decode's length 1, or a multiple of 16, apart)
_ANY_LENGTH = ["length", "snapshot_rows", "run_tree"]
_scan_any_length = triton.jit(do_not_specialize=_ANY_LENGTH)(_scan_kernel.fn)
_norm_any_length = triton.jit(do_not_specialize=_ANY_LENGTH)(_norm_kernel.fn)


def _head_block(head_dim: int, programs_per_block: int, device: torch.device) -> int:
    """Rows of a head's state per program: up to ``max_head_block``, fewer while the grid would not cover
    every SM twice (decode of one to a few sequences)."""
    block = min(max_head_block, triton.next_power_of_2(head_dim))
    while block > 8 and programs_per_block * triton.cdiv(head_dim, block) < 2 * num_sms(device):
        block //= 2
    return block


def mamba2_step(
    mixer: Mamba2Mixer,
    zxbcdt: torch.Tensor,
    token_table: torch.Tensor,
    query_lens: torch.Tensor,
    recurrent: RecurrentMetadata,
) -> torch.Tensor:
    """The mixer's step from in_proj's output to out_proj's input (module docstring).

    zxbcdt [num_tokens, inner + conv_channels + heads] (in_proj's output, model dtype); token_table
    [runs, len] (each run position's flat token; attention/metadata.py); query_lens [runs] (positions
    t < query_lens[r] are the run's tokens); ``recurrent``: the rows each run reads and writes, a tree's
    parents (verify only) and whether the step keeps snapshots -> y [num_tokens, inner], normalised.
    The mixer's bound state (``states``, ``snapshots``) is updated as its eager path stores it."""
    runs, length = token_table.shape
    heads, p, groups, n = mixer.num_heads, mixer.head_dim, mixer.num_groups, mixer.state_size
    conv, ssm = (
        mixer.states["conv"],
        mixer.states["ssm"],
    )  # [slots, keep, channels], [slots, heads, p, n]
    keep = conv.shape[1]
    tree, snapshots = recurrent.parents is not None, recurrent.snapshots
    if tree and not snapshots:
        raise ValueError("a tree is only verified: its step keeps snapshots")
    conv_snap, ssm_snap = (
        (mixer.snapshots["conv"], mixer.snapshots["ssm"]) if snapshots else (conv, ssm)
    )  # [slots, rows, keep, channels], [slots, rows, heads, p, n] (unused stubs in decode)
    if snapshots and length > ssm_snap.shape[1]:
        raise ValueError(f"{length} verified tokens, the state snapshots hold {ssm_snap.shape[1]}")
    for t in (zxbcdt, conv, ssm, conv_snap, ssm_snap):
        assert t.is_contiguous(), "the kernels address state rows and token rows densely"
    # zeros in a padded run's padding rows, which no program writes (deltanet_step_kernel.py ``deltanet_step``)
    alloc = zxbcdt.new_empty if recurrent.run_lens is None else zxbcdt.new_zeros
    y = alloc(zxbcdt.shape[0], mixer.inner)  # [num_tokens, inner]
    if runs == 0 or length == 0:
        return y
    conv_bias = mixer.conv1d.bias
    rows = ssm_snap.shape[1] if snapshots else 0
    invariant = batch_invariant()  # (module docstring: batch-invariant mode)
    parents = recurrent.kernel_parents(token_table)
    common = (zxbcdt, zxbcdt.stride(0), token_table, query_lens, recurrent.state_indices)
    block = _head_block(p, heads if invariant else runs * heads, zxbcdt.device)
    pdl = pdl_available(zxbcdt.device)
    scan, norm = (_scan_any_length, _norm_any_length) if invariant else (_scan_kernel, _norm_kernel)
    scan[(runs, heads, triton.cdiv(p, block))](
        *common,
        recurrent.has_initial_state,
        parents,
        conv,
        ssm,
        ssm_snap,
        rows,
        mixer.conv1d.weight,  # [channels, 1, width]: channel c's taps at c * width
        conv_bias if conv_bias is not None else conv,
        mixer.dt_bias,
        mixer.A_log,
        mixer.D,
        y,
        length,
        mixer.time_step_min,
        int(tree),
        HEADS=heads,
        GROUPS=groups,
        P=p,
        N=n,
        KEEP=keep,
        BP=block,
        BN=triton.next_power_of_2(n),
        WB=triton.next_power_of_2(keep + 1),
        HAS_BIAS=conv_bias is not None,
        TREE=tree,
        FORM_ARG=invariant,
        SNAPSHOTS=snapshots,
        PDL=pdl,
        num_warps=scan_warps,
        **pdl_launch_options(pdl),
        **invariant_launch_options(),
    )
    norm[(runs, length, groups)](
        *common,
        recurrent.has_initial_state,
        parents,
        conv,
        conv_snap,
        rows,
        mixer.norm.weight,
        y,
        length,
        mixer.norm.eps,
        int(tree),
        HEADS=heads,
        GROUPS=groups,
        P=p,
        N=n,
        KEEP=keep,
        BG=triton.next_power_of_2(heads // groups * p),
        BN=triton.next_power_of_2(n),
        WB=triton.next_power_of_2(keep + 1),
        TREE=tree,
        FORM_ARG=invariant,
        SNAPSHOTS=snapshots,
        PDL=pdl,
        num_warps=norm_warps,
        **pdl_launch_options(pdl),
        **invariant_launch_options(),
    )
    return y
