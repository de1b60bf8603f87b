"""Gated DeltaNet's few-row step (decode, verify: runs of at most ``FUSED_MAX_LEN`` tokens) as one Triton
launch per layer between the input projections and out_proj (layers/gated_deltanet.py is the
reference: ``GatedDeltaNet.forward`` with ``fused_step`` off).

One program per (sequence, value head, split) walks its run token by token and does all of the layer's
per-token work in registers, over its split's value columns (below):

- the causal convolution (layers/causal_conv.py): the window of token t is read from the projections'
  outputs and, before the run, from the conv state row (zeros without ``has_initial_state``); in a draft
  tree it follows each node's parents, reaching into the state rows above the root;
- silu, q and k L2-normalised (eps 1e-6 under the square root), q scaled by head_k_dim ** -0.5;
- beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (torch's softplus: x above 20 is x);
- the delta rule from the state row (zeros without ``has_initial_state``); in a tree, token t starts from its
  parent's state, read back from the snapshot row this program wrote (a barrier between);
- the gated RMSNorm (weight, then silu(z)), written as the out_proj input [num_tokens, v_heads * v_dim].

The split: the delta rule is independent per value column (S [k_dim, v_dim] decays, kv_mem = k @ S, delta = (v -
kv_mem) * beta, S += outer(k, delta), o = q @ S), so a program may own a slice of the head's columns: its slice
of S, of v and its conv channels, of o, with the same arithmetic per column. A grid of (num_seqs, v_heads) alone
leaves most of the GPU idle at small batches (Qwen3.5 at batch 1: 32 programs on an H200's 132 SMs, each walking
its tokens serially; measured before the split, a captured MTP verify: 7.1 us a layer at 1 token a sequence,
14.1 at 3), so ``value_splits`` splits each head over a power of two of programs, at least ``MIN_SPLIT_COLUMNS``
columns each, while the grid stays within ``PROGRAMS_PER_SM`` programs an SM: Qwen3.5's 32 heads in 4 at batch
1, 2 at batch 2, 1 from batch 4 (and always in batch-invariant mode: the split sets the compiled reductions'
layout, so it must not follow the batch). Each run length is otherwise its own compilation (``LENGTH``, a
constant: the decode's loop is known to run once). Compiled for a run of 1 and of 3, the same token's float32
state came out with other last bits on the H200 (tinyqwen35's shape in bf16: 348 of 4096 values, every seed;
benchmarks/results/gpu_2026-12-03d call 2), enough to turn a bf16 output now and then; compiled for a draft
tree, a tree node's state and output had other last bits than its path decoded (gpu_2026-12-03e call 1). So in
batch-invariant mode every run takes one compilation (``_deltanet_step_any_form``, SPECIALIZED False):
``LENGTH`` is ``FUSED_MAX_LEN``, a bound, and the run's length and form (chain or tree) are runtime arguments
(``run_len``, ``run_tree``) that Triton does not specialise, nor the tables' row strides. That mode's launch also
turns floating-point contraction off.

SPLITS == 1 is the kernel without the split (a constexpr branch: no scratch, no atomic). The norm is the one step
across columns: each program writes its o slices (float32, ``o_part``), meets its threads at a barrier and counts
itself in its head's arrival counter (an atomic add, acq_rel at gpu scope: its writes released, and the last to
arrive acquires every split's); the last normalises the whole row of each of the run's tokens from ``o_part``
(read past L1, which other SMs' writes do not reach) and zeroes the counter for the next launch. One program
computes each row's norm over the full row, so the result does not depend on the order in which the programs
finish. The counters (layers/zeroed_scratch.py) are zeroed once per device and grid, left zero by every launch:
the launch allocates nothing but ``o_part`` and stays capturable.

What it keeps (layers/recurrent.py ``RecurrentMetadata``): with ``snapshots`` (verify) the conv and recurrent
state after every valid token t go into snapshot row t of the sequence's state row, the row itself only read;
without (decode, prefill), the state after the run's last valid token goes into the row. A chain's verify with
``last_row`` (LAST_IN_ROW) does both, but the run's last position (last_row = LENGTH - 1) keeps no snapshot:
its state goes into the row as decode's does. Padding positions (past a run's query length) are neither output
nor kept.

Conv channels (all q, all k, all v) are shared: the q and k channels of key head kh serve its
``group = v_heads / k_heads`` value heads. Every program of a group computes them; into the snapshot rows
only the first split of the group's last value head writes them (its v channels are each program's own), so
no two programs write the same bytes. When the row itself is written (decode), every program of the group
reads the old q / k window from it, so only the group's last program to finish may rewrite it: each program
counts itself in its (sequence, key head)'s arrival counter after its reads (acq_rel at gpu scope, as the
split's norm counter below), and the last to arrive reads the old window once more, writes the run's last
window and zeroes the counter (a second launch per (sequence, key head) did it before: 1.8 us a layer of
the Qwen3-Next slice's decode at batch 1 on the H200, benchmarks/results/gpu_2026-12-01e call 2). (One
program taking a whole group, as this kernel first did, left Qwen3.5's decode at batch 1 on 16 programs:
14.5 us a layer on the H200, benchmarks/results/gpu_2026-11-29f call 2.)

B AND A FROM THE ROWS (``ProjectedRows.ba_rows``): a checkpoint that keeps b and a's projections unquantized beside
quantized q/k/v/z (Qwen3-Next-FP8's in_proj_ba, Qwen3.5-FP8's in_proj_b and in_proj_a) cannot pack them into one
launch with those. Rather than a launch of their own, each program projects its value head's two values itself:
before its first token it reads the run's rows [BT, hidden] and its head's weight row of each, sums the products
across the columns in one reduction (the two at once), applies the input norm's factor where the rows are the
stream times the norm's weight, and rounds to the rows' dtype, as that projection's output is rounded. Each split
of a head computes them alike. The sums run in another order than the projection kernel's, so the values may
differ from its in the last bit.

Latency, not bytes, sets this kernel's time at small batches (a layer's 2 MB of Qwen3.5 state in 7 us at batch
1, 11.2 us for a verify of 3 tokens: benchmarks/results/gpu_2026-12-02 call 4), so it hides what it waits on
and waits as little as it can:

- Few reductions across warps: each one meets the program's warps at barriers (through shared memory), and a
  token's arithmetic is a chain of them. A token's two squared norms and q . k are one reduction, k @ S and
  q @ S (S the decayed state) another, o taken as q @ S + (q . k) delta (the same value as q @ S after the
  update); a split head's norm reduces all the run's rows at once. Compiled by Triton 3.7.1 for sm_90 at
  Qwen3.5's batch-1 verify (4 splits), the token loop holds 13 barriers where it held 19 (the PTX's
  ``bar.sync``; tests/kernels/test_deltanet_step.py counts them).

- Look-ahead: a token's loads (its conv windows, beta's logit and the decay's input: layers/gated_deltanet.py's
  projections) do not depend on the state, so each token issues the next one's before its own arithmetic and
  the loop waits on memory once, not once a token.
- PDL (layers/pdl.py): launched as a dependent of the input projections, a program loads the layer's parameters
  (conv weights, A_log, dt_bias, the norm's weight: never written while serving) and asks for its state tile's
  lines in L2 before ``pdl_enter``, while the projections finish; and out_proj, launched as its dependent, may
  prefetch its weights while this kernel runs. The prefetch's state row comes from a read of ``state_indices``
  before the wait. The index tensors are written by host copies and torch kernels, which launch no dependents
  early, so every kernel after them starts after they end: the read sees a written row (a pool address). The
  prefetch is only a hint all the same (L2 is coherent), and that read bypasses L1 (``.cg``), so the read after
  the wait never meets a line it cached.

Grid (num_seqs, v_heads, splits) and loop bounds come from shapes only (no host sync): capturable in a CUDA
graph (the run length a compile-time constant, or in batch-invariant mode an argument fixed at capture). Each
program holds its split's [k_dim, v_dim / splits] float32 state (one wide load, as memory-bound decode wants);
in a tree it reads back only its own columns of the parent's snapshot, so the barrier before stays within the
program. The run's flat rows and parents are read once into registers, so a token waits on no index load
before its inputs'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from outpace.attention.context import batch_invariant, invariant_launch_options
from outpace.layers.fused_kernels import row_rstd
from outpace.layers.pdl import pdl_available, pdl_enter, pdl_launch_options, prefetch_l2
from outpace.layers.recurrent import RecurrentMetadata
from outpace.layers.sm_count import num_sms
from outpace.layers.zeroed_scratch import zeroed_scratch

FUSED_MAX_LEN = (
    16  # the longest run the step kernel takes (a verify's draft tokens); longer: prefill path
)
SOFTPLUS_THRESHOLD = tl.constexpr(
    20.0
)  # torch.nn.functional.softplus: x above it is returned as is
# The fewest value columns a program of a split head takes, and the programs an SM the splits may fill. One
# layer's forward at Qwen3.5's shape (benchmarks/scripts/deltanet_step_settings.py, gpu_2026-11-30e call 3),
# at 1 / 2 / 3 / 4 tokens a sequence: batch 1, unsplit 42.3 / 47.2 / 51.0 / 55.0 us, 4 splits 42.4 / 46.3 /
# 48.6 / 51.5, 8 splits (16 columns) 43.5 / 47.5 / 51.4 / 54.8; batch 2, 2 splits 44.0 / 48.5 / 52.4 / 56.4
# against 4 splits 44.4 / 49.4 / 53.3 / 57.8; batch 4, unsplit 45.9 .. 62.4 against 2 splits 47.6 .. 64.9.
MIN_SPLIT_COLUMNS = 32
BA_COLUMNS = 256  # hidden columns a step of b and a's projection from the rows (BaRows)
PROGRAMS_PER_SM = 1
LINE_WORDS = tl.constexpr(32)  # float32 state words in a 128-byte line (the L2 prefetch's unit)


@dataclass
class ProjectedRows:
    """Where the kernel finds each token's projections: element offsets within a row of the given tensors,
    ``*_group`` the step from one key head's block to the next (the two checkpoint layouts:
    layers/gated_deltanet.py). Every tensor is [num_tokens, row] with unit stride along the row."""

    qkv: torch.Tensor  # [n, *] the q, k and v projections
    q: int  # q of key head kh: q + kh * qk_group
    k: int
    qk_group: int
    v: int  # v of value head h: v + (h // group) * v_group + (h % group) * head_v_dim
    v_group: int
    z: torch.Tensor  # [n, *] the output gate, laid out like v
    z_offset: int
    z_group: int
    b: (
        torch.Tensor
    )  # [n, *] beta's logit of value head h: b_offset + (h // group) * ba_group + h % group
    b_offset: int
    a: torch.Tensor  # [n, *] the decay's input, laid out like b
    a_offset: int
    ba_group: int
    # b and a by the kernel from the rows (``BaRows``): ``b`` and ``a`` are then their projections' weights
    # [*, hidden], where a value's column above names its weight row
    ba_rows: BaRows | None = None


@dataclass(frozen=True)
class BaRows:
    """The rows b and a are projected from, where the step kernel projects them itself (module docstring: B AND A
    FROM THE ROWS): x [n, hidden] as a norm-folding projection reads it, the stream times the norm's weight
    (``NormedRows.normed``) with the stream's partial sums of squares ``sq_parts`` [P, n] float32 and the norm's
    ``eps``, or the input already normalised (``sq_parts`` None)."""

    x: torch.Tensor
    sq_parts: torch.Tensor | None
    eps: float


@triton.jit
def _conv_window(
    proj,
    proj_row,
    proj_cols,
    conv_row,
    conv_channels,
    table_rows,
    pos,
    taps_used,
    start,
    cmask,
    KEEP: tl.constexpr,
    CHANNELS: tl.constexpr,
):
    """The window [taps, channels] float32 at extended positions ``pos`` [taps] (< KEEP: rows of the conv
    state ``conv_row``, zeros unless ``start``; else the token at flat row ``table_rows``)."""
    from_node = (pos >= KEEP) & taps_used
    from_state = (pos < KEEP) & taps_used & start
    node = tl.load(
        proj + table_rows[:, None] * proj_row + proj_cols[None, :],
        mask=from_node[:, None] & cmask[None, :],
        other=0.0,
    )
    state = tl.load(
        conv_row + pos[:, None] * CHANNELS + conv_channels[None, :],
        mask=from_state[:, None] & cmask[None, :],
        other=0.0,
    )
    return node.to(tl.float32) + state.to(tl.float32)


@triton.jit
def _window_positions(t, run_parents, slots, taps, KEEP: tl.constexpr, tree):
    """[BW] the extended positions of token t's conv window, oldest first (< KEEP: rows of the conv state,
    else run position e - KEEP): in a chain t .. t + KEEP; in a tree the node's ancestors, walked back
    through ``run_parents`` [BT] (-1 at the root), reaching into the state rows above the root. ``tree`` a
    constexpr (a specialised launch) or a runtime flag (batch-invariant mode: both branches compiled)."""
    if tree:
        e = KEEP + t
        pos = tl.where(taps == KEEP, e, 0)
        for i in tl.static_range(KEEP):
            p = _pick(run_parents, e - KEEP, slots)
            e = tl.where(e >= KEEP, tl.where(p >= 0, p + KEEP, KEEP - 1), tl.maximum(e - 1, 0))
            pos = tl.where(taps == KEEP - 1 - i, e, pos)
    else:
        pos = t + taps
    return pos


@triton.jit
def _token_inputs(
    t, pos, run_rows, slots, qkv, qkv_row, q_cols, k_cols, v_cols, b, b_row, a, a_row, b_cols,
    a_cols, run_b, run_a, conv_row, qc, kc, vc, used, start, km, vm, KEEP: tl.constexpr,
    CHANNELS: tl.constexpr, BA_ROWS: tl.constexpr, length,
):  # fmt: skip
    """Token t's loads, none of which depends on the state: its q, k and v conv windows [BW, BK / BV]
    float32 (at ``pos``), beta's logit and the decay's input (float32 scalars; with BA_ROWS picked from the
    run's, ``run_b`` / ``run_a`` [BT]), and its flat row. Nothing is read for t >= length (the loop's look-ahead
    past the run's end)."""
    here = t < length
    rows = _pick_each(run_rows, pos - KEEP, slots)  # [BW] the flat token of each window position
    taps_used = used & here
    xq = _conv_window(
        qkv, qkv_row, q_cols, conv_row, qc, rows, pos, taps_used, start, km, KEEP, CHANNELS
    )
    xk = _conv_window(
        qkv, qkv_row, k_cols, conv_row, kc, rows, pos, taps_used, start, km, KEEP, CHANNELS
    )
    xv = _conv_window(
        qkv, qkv_row, v_cols, conv_row, vc, rows, pos, taps_used, start, vm, KEEP, CHANNELS
    )
    row = _pick(run_rows, t, slots)
    if BA_ROWS:
        b_t, a_t = _pick(run_b, t, slots), _pick(run_a, t, slots)
    else:
        b_t = tl.load(b + row * b_row + b_cols, mask=here, other=0.0).to(tl.float32)
        a_t = tl.load(a + row * a_row + a_cols, mask=here, other=0.0).to(tl.float32)
    return xq, xk, xv, b_t, a_t, row


@triton.jit
def _b_and_a_of_rows(
    x, x_row, sq, sq_row, num_sq_parts, in_eps, hidden, b, b_row, a, a_row, b_cols, a_cols, run_rows,
    in_run, ROW_NORM: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr, BP: tl.constexpr,
):  # fmt: skip
    """Beta's logit and the decay's input [BT] of each run position, float32 (module docstring: B AND A FROM
    THE ROWS): the rows x [BT, hidden] times the weight rows ``b_cols`` of b and ``a_cols`` of a, the products
    summed across the columns in one reduction, times each row's norm factor (ROW_NORM: x is the stream times
    the norm's weight), rounded to x's dtype as the projection's output is."""
    cols = tl.arange(0, BH)
    acc_b = tl.zeros([BT, BH], tl.float32)
    acc_a = tl.zeros([BT, BH], tl.float32)
    for k0 in range(0, hidden, BH):
        k = k0 + cols
        k_ok = k < hidden
        xs = tl.load(
            x + run_rows[:, None] * x_row + k[None, :],
            mask=in_run[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)  # [BT, BH]
        wb = tl.load(b + b_cols * b_row + k, mask=k_ok, other=0.0).to(tl.float32)  # [BH]
        wa = tl.load(a + a_cols * a_row + k, mask=k_ok, other=0.0).to(tl.float32)
        acc_b += xs * wb[None, :]
        acc_a += xs * wa[None, :]
    run_b, run_a = tl.split(tl.sum(tl.join(acc_b, acc_a), axis=1))  # [BT] each
    if ROW_NORM:  # RMSNorm(s) @ W.T = rsqrt(mean(s^2) + eps) * ((s * w) @ W.T)
        factor = tl.reshape(
            row_rstd(sq, run_rows, in_run, sq_row, num_sq_parts, hidden, in_eps, BP), [BT]
        )
        run_b, run_a = run_b * factor, run_a * factor
    dtype = x.dtype.element_ty
    return run_b.to(dtype).to(tl.float32), run_a.to(dtype).to(tl.float32)


@triton.jit
def _silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def _pick(values, index, slots):
    """values[index] for a register vector ``values`` over ``slots`` (= tl.arange) and a scalar index
    (0 where out of range): a compare and sum, so the per-token loop waits on no memory for it."""
    return tl.sum(tl.where(slots == index, values, 0), axis=0)


@triton.jit
def _pick_each(values, index, slots):
    """values[index] for a vector ``index`` [n] (0 where out of range)."""
    return tl.sum(tl.where(index[:, None] == slots[None, :], values[None, :], 0), axis=1)


@triton.jit
def _gated_norm(o, weight, gate, eps, DV: tl.constexpr):
    """The gated RMSNorm of one head's output rows o [..., n] over the last axis (zeros past DV): weight [n],
    then silu(gate)."""
    return weight * o * tl.rsqrt(tl.sum(o * o, axis=-1, keep_dims=True) / DV + eps) * _silu(gate)


@triton.jit
def _norm_head_rows(
    o_part,
    z,
    z_row,
    z_head,
    norm_w,
    out,
    run_rows,
    slots,
    n_tokens,
    h,
    eps,
    V_HEADS: tl.constexpr,
    DV: tl.constexpr,
    ROW: tl.constexpr,
    length,
):
    """Value head h's gated norm over its run, by the head's last program to finish: every valid token's
    whole output row from ``o_part`` [num_tokens, V_HEADS, DV] float32 (every split's columns, read past
    L1, which other SMs' writes do not reach), its gate from z (its head's columns from ``z_head``), into
    ``out``. All the run's rows at once [BT, ROW]: one round trip to L2 and one reduction, not one a token."""
    cols = tl.arange(0, ROW)
    cm = cols < DV
    weight = tl.load(norm_w + cols, mask=cm, other=0.0).to(tl.float32)
    rows = run_rows[:, None]  # [BT, 1] each token's flat row
    keep = ((slots < n_tokens) & (slots < length))[:, None] & cm[None, :]
    o = tl.load(
        o_part + (rows * V_HEADS + h) * DV + cols[None, :],
        mask=keep,
        other=0.0,
        cache_modifier=".cg",
    )
    gate = tl.load(z + rows * z_row + z_head + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    o = _gated_norm(o, weight, gate, eps, DV)
    tl.store(out + rows * V_HEADS * DV + h * DV + cols[None, :], o, mask=keep)


@triton.jit
def _deltanet_step_kernel(
    qkv,
    qkv_row,
    q_off,
    k_off,
    qk_group,
    v_off,
    v_group,
    z,
    z_row,
    z_off,
    z_group,
    b,
    b_row,
    b_off,
    a,
    a_row,
    a_off,
    ba_group,
    x_rows,  # [n, hidden] (BA_ROWS): the rows b and a are projected from
    x_row,
    sq_parts,  # [P, n] float32 (ROW_NORM): their partial sums of squares
    sq_row,
    num_sq_parts,
    in_eps,
    hidden,
    conv_w,
    A_log,
    dt_bias,
    norm_w,
    table,
    table_row,
    query_lens,
    has_initial,
    state_indices,
    parents,
    parents_row,
    conv_state,
    rec_state,
    conv_snap,
    rec_snap,
    out,
    o_part,
    counters,
    qk_counters,
    snap_rows,
    eps,
    scale,
    run_len,
    run_tree,
    K_HEADS: tl.constexpr,
    V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    KEEP: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BW: tl.constexpr,
    LENGTH: tl.constexpr,
    SPECIALIZED: tl.constexpr,  # the run's length and form compiled in (module docstring)
    BT: tl.constexpr,
    TREE: tl.constexpr,
    SNAPSHOTS: tl.constexpr,
    LAST_IN_ROW: tl.constexpr,
    SPLITS: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    BA_ROWS: tl.constexpr,  # b and a projected here from x_rows, b and a being their weights (BaRows)
    ROW_NORM: tl.constexpr,  # (BA_ROWS) x_rows is the stream times the norm's weight, sq_parts its sums
    BH: tl.constexpr,  # (BA_ROWS) hidden columns a step
    BP: tl.constexpr,  # (ROW_NORM) a power of two >= num_sq_parts
):
    CHANNELS: tl.constexpr = 2 * K_HEADS * DK + V_HEADS * DV
    WIDTH: tl.constexpr = KEEP + 1
    seq, h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ks, taps = tl.arange(0, BK), tl.arange(0, BW)  # taps: oldest first
    vs = split * BV + tl.arange(0, BV)  # the split's value columns
    km, vm, used = ks < DK, vs < DV, taps < WIDTH
    m2 = km[:, None] & vm[None, :]
    tile = ks[:, None] * DV + vs[None, :]  # [BK, BV] within [DK, DV]
    if SPECIALIZED:  # the run's length and form, compiled in
        length = LENGTH
        tree: tl.constexpr = TREE
    else:  # batch-invariant mode: at most LENGTH, one compilation for every run (module docstring)
        length = run_len
        tree = run_tree != 0
    slots = tl.arange(0, BT)  # the run's positions
    in_run = slots < length
    kh, hg = h // GROUP, h % GROUP
    # the group's q / k conv channels are written by its last head's first split
    writes_qk = (hg == GROUP - 1) & (split == 0)
    qc = kh * DK + ks  # conv channels
    kc = K_HEADS * DK + qc
    vc = 2 * K_HEADS * DK + h * DV + vs
    q_cols = q_off + kh * qk_group + ks  # columns of the projections' rows
    k_cols = k_off + kh * qk_group + ks
    v_cols = v_off + kh * v_group + hg * DV + vs
    z_cols = z_off + kh * z_group + hg * DV + vs
    b_cols = b_off + kh * ba_group + hg  # beta's logit's column, and the decay input's
    a_cols = a_off + kh * ba_group + hg
    wmask = used[:, None]
    wq = tl.load(conv_w + qc[None, :] * WIDTH + taps[:, None], mask=wmask & km[None, :], other=0.0)
    wk = tl.load(conv_w + kc[None, :] * WIDTH + taps[:, None], mask=wmask & km[None, :], other=0.0)
    wv = tl.load(conv_w + vc[None, :] * WIDTH + taps[:, None], mask=wmask & vm[None, :], other=0.0)
    wq, wk, wv = wq.to(tl.float32), wk.to(tl.float32), wv.to(tl.float32)  # [BW, BK / BV]
    neg_a = -tl.exp(tl.load(A_log + h).to(tl.float32))
    bias = tl.load(dt_bias + h).to(tl.float32)
    if SPLITS == 1:
        weight = tl.load(norm_w + vs, mask=vm, other=0.0).to(tl.float32)
    if PDL:  # the state's lines into L2 while the projections finish (module docstring: PDL)
        hint = tl.load(state_indices + seq, cache_modifier=".cg").to(tl.int64)
        lines = ks[:, None] * DV + split * BV + tl.arange(0, PREFETCH_LINES)[None, :] * LINE_WORDS
        lines = tl.where(km[:, None], lines, 0)
        prefetch_l2(rec_state + (hint * V_HEADS + h) * DK * DV + lines)
    pdl_enter(PDL)  # before any read of an earlier kernel's output or any write
    sidx = tl.load(state_indices + seq).to(tl.int64)
    n_tokens = tl.load(query_lens + seq)
    start = tl.load(has_initial + seq) != 0
    run_rows = tl.load(table + seq * table_row + slots, mask=in_run, other=0).to(tl.int64)  # [BT]
    if tree:  # [BT] int32 each position's parent (-1: the root)
        run_parents = tl.load(parents + seq * parents_row + slots, mask=in_run, other=-1).to(
            tl.int32
        )
    else:
        run_parents = tl.full([BT], -1, tl.int32)  # (not read)
    conv_row = conv_state + sidx * KEEP * CHANNELS  # [KEEP, CHANNELS]
    conv_snaps = conv_snap + sidx * snap_rows * KEEP * CHANNELS  # [snap_rows, KEEP, CHANNELS]
    row_state = rec_state + (sidx * V_HEADS + h) * DK * DV + tile
    s = tl.load(row_state, mask=m2 & start, other=0.0)  # [BK, BV] the run's start state
    if (
        BA_ROWS
    ):  # the run's b and a, before its first token (module docstring: B AND A FROM THE ROWS)
        run_b, run_a = _b_and_a_of_rows(
            x_rows, x_row, sq_parts, sq_row, num_sq_parts, in_eps, hidden, b, b_row, a, a_row, b_cols,
            a_cols, run_rows, in_run, ROW_NORM, BT, BH, BP,
        )  # fmt: skip
    else:
        run_b = tl.zeros([BT], tl.float32)  # (not read)
        run_a = run_b
    # token 0's inputs; each token loads the next one's before its own arithmetic (module docstring)
    pos = _window_positions(0, run_parents, slots, taps, KEEP, tree)
    xq, xk, xv, b_t, a_t, row = _token_inputs(
        0, pos, run_rows, slots, qkv, qkv_row, q_cols, k_cols, v_cols, b, b_row, a, a_row,
        b_cols, a_cols, run_b, run_a, conv_row, qc, kc, vc, used, start, km, vm, KEEP, CHANNELS,
        BA_ROWS, length,
    )  # fmt: skip
    for t in range(length):
        valid = t < n_tokens
        next_pos = _window_positions(t + 1, run_parents, slots, taps, KEEP, tree)
        next_xq, next_xk, next_xv, next_b, next_a, next_row = _token_inputs(
            t + 1, next_pos, run_rows, slots, qkv, qkv_row, q_cols, k_cols, v_cols, b, b_row, a,
            a_row, b_cols, a_cols, run_b, run_a, conv_row, qc, kc, vc, used, start, km, vm, KEEP,
            CHANNELS, BA_ROWS, length,
        )  # fmt: skip
        if tree:  # the node's start state: its parent's snapshot, or the row's state at the root
            p = _pick(run_parents, t, slots)
            root = p < 0  # (the row's state read again: one tile fewer held in registers)
            # one scalar base, then the tile's offsets (a select of two pointer tiles held both)
            parent = rec_snap + ((sidx * snap_rows + p) * V_HEADS + h) * DK * DV
            base = tl.where(root, rec_state + (sidx * V_HEADS + h) * DK * DV, parent)
            s = tl.load(base + tile, mask=m2 & (start | ~root), other=0.0)
        qt, kt, vt = (
            _silu(tl.sum(xq * wq, axis=0)),
            _silu(tl.sum(xk * wk, axis=0)),
            _silu(tl.sum(xv * wv, axis=0)),
        )
        # the squared norms and q . k in one reduction (each reduction across warps costs barriers)
        squares = tl.join(tl.join(qt * qt, kt * kt), tl.join(qt * kt, tl.zeros_like(qt)))
        norms, dots = tl.split(tl.sum(squares, axis=0))
        qq, kk = tl.split(norms)
        rq, rk = tl.rsqrt(qq + 1e-6) * scale, tl.rsqrt(kk + 1e-6)
        qt, kt, qk = qt * rq, kt * rk, tl.split(dots)[0] * rq * rk
        beta = tl.sigmoid(b_t)
        x = a_t + bias
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
        # a padding token keeps the state: decay 1, k 0 and no update, so exactly s whatever its inputs (a
        # captured prefill's padding rows hold what the layer before left there, NaN possibly, and 0 * NaN
        # is NaN); no second tile held
        kt = tl.where(valid, kt, 0.0)
        sn = s * tl.where(valid, tl.exp(neg_a * softplus), 1.0)
        # k @ sn and q @ sn in one reduction; q @ (sn + outer(k, delta)) = q @ sn + (q . k) delta
        kv, qs = tl.split(tl.sum(tl.join(sn * kt[:, None], sn * qt[:, None]), axis=0))  # [BV]
        delta = tl.where(valid, (vt - kv) * beta, 0.0)  # [BV]
        sn = sn + kt[:, None] * delta[None, :]
        o = qs + qk * delta  # [BV]
        if SPLITS == 1:
            gate = tl.load(z + row * z_row + z_cols, mask=vm, other=0.0).to(tl.float32)
            o = _gated_norm(o, weight, gate, eps, DV)
            tl.store(out + row * V_HEADS * DV + h * DV + vs, o, mask=vm & valid)
        else:  # the head's last program to finish normalises the whole row (below)
            tl.store(o_part + (row * V_HEADS + h) * DV + vs, o, mask=vm & valid)
        # the state after token t: snapshot row t (with LAST_IN_ROW the last token's goes into the row)
        if SNAPSHOTS:
            snapped = valid
            if LAST_IN_ROW:
                snapped = valid & (t < length - 1)
            # the window's rows 1..KEEP are the conv state
            kept = (taps >= 1)[:, None] & used[:, None] & snapped
            snap = conv_snaps + (t * KEEP + taps[:, None] - 1) * CHANNELS
            dtype = conv_snap.dtype.element_ty
            tl.store(snap + vc[None, :], xv.to(dtype), mask=kept & vm[None, :])
            tl.store(snap + qc[None, :], xq.to(dtype), mask=kept & km[None, :] & writes_qk)
            tl.store(snap + kc[None, :], xk.to(dtype), mask=kept & km[None, :] & writes_qk)
            here = rec_snap + ((sidx * snap_rows + t) * V_HEADS + h) * DK * DV + tile
            tl.store(here, sn, mask=m2 & snapped)
            if tree:
                tl.debug_barrier()  # later nodes read this state back
        s = sn
        xq, xk, xv, b_t, a_t, row = next_xq, next_xk, next_xv, next_b, next_a, next_row
    if not SNAPSHOTS or LAST_IN_ROW:  # the row: the state after the last valid token (a chain)
        pos = n_tokens + taps  # the last valid token's window rows 1..KEEP, at taps 0..KEEP - 1
        final_used = taps < KEEP
        rows = _pick_each(run_rows, pos - KEEP, slots)
        fv = _conv_window(
            qkv, qkv_row, v_cols, conv_row, vc, rows, pos, final_used, start, vm, KEEP, CHANNELS
        )
        # every thread's reads of the row's window before a write: the head's v channels (its own), and
        # the group's count below (one thread takes it for the program)
        tl.debug_barrier()
        place = conv_row + taps[:, None] * CHANNELS
        keep = final_used[:, None] & vm[None, :]
        tl.store(place + vc[None, :], fv.to(conv_state.dtype.element_ty), mask=keep)
        tl.store(row_state, s, mask=m2)
        # the group's q / k channels, by its last program to have read them (acq_rel at gpu scope, as the
        # split's count below): every program of the group read the old window before it arrived
        qk_counter = qk_counters + seq * K_HEADS + kh
        if tl.atomic_add(qk_counter, 1, sem="acq_rel", scope="gpu") == GROUP * SPLITS - 1:
            fq = _conv_window(
                qkv, qkv_row, q_cols, conv_row, qc, rows, pos, final_used, start, km, KEEP, CHANNELS
            )
            fk = _conv_window(
                qkv, qkv_row, k_cols, conv_row, kc, rows, pos, final_used, start, km, KEEP, CHANNELS
            )
            tl.debug_barrier()  # every warp's reads of the q / k window before its write
            qk_keep = final_used[:, None] & km[None, :]
            tl.store(place + qc[None, :], fq.to(conv_state.dtype.element_ty), mask=qk_keep)
            tl.store(place + kc[None, :], fk.to(conv_state.dtype.element_ty), mask=qk_keep)
            tl.atomic_xchg(qk_counter, 0)  # zero again for the next launch
    if SPLITS > 1:
        # every thread's o columns before the count (one thread takes it for the program); acq_rel at gpu
        # scope: releases this program's columns, and the last to arrive acquires every split's
        tl.debug_barrier()
        counter = counters + seq * V_HEADS + h
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            _norm_head_rows(
                o_part, z, z_row, z_off + kh * z_group + hg * DV, norm_w, out, run_rows, slots,
                n_tokens, h, eps, V_HEADS, DV, BV * SPLITS, length,
            )  # fmt: skip
            tl.atomic_xchg(counter, 0)  # zero again for the next launch


# batch-invariant mode's one compilation for every run (module docstring): the run's length and form and the
# tables' row strides not specialised (Triton compiles an integer argument of 1 apart)
_deltanet_step_any_form = triton.jit(
    do_not_specialize=["run_len", "run_tree", "table_row", "parents_row"]
)(_deltanet_step_kernel.fn)


def num_warps(bk: int, bv: int) -> int:
    """The launch's warps for a [bk, bv] state block: 8 for 128 x 128 (16 spill registers on sm_90,
    tests/kernels/test_deltanet_step.py compiles it), fewer for smaller blocks."""
    return max(4, min(8, bk * bv // 2048))


def value_splits(num_seqs: int, v_heads: int, v_dim: int, sms: int) -> int:
    """Programs per (sequence, value head) (module docstring): the most, a power of two, that leaves each at
    least ``MIN_SPLIT_COLUMNS`` value columns and the grid within ``PROGRAMS_PER_SM`` programs an SM; 1
    once the heads alone fill the GPU."""
    splits = 1
    while (
        2 * splits * MIN_SPLIT_COLUMNS <= v_dim
        and num_seqs * v_heads * 2 * splits <= PROGRAMS_PER_SM * sms
    ):
        splits *= 2
    return splits


def deltanet_step(
    rows: ProjectedRows,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    token_table: torch.Tensor,
    query_lens: torch.Tensor,
    recurrent: RecurrentMetadata,
    states: dict[str, torch.Tensor],
    snapshots: dict[str, torch.Tensor],
    num_k_heads: int,
    head_k_dim: int,
    head_v_dim: int,
) -> torch.Tensor:
    """The layer's step from its projections to out_proj's input (module docstring). conv_weight [channels,
    1, width] (the checkpoint's depthwise conv); A_log, dt_bias [v_heads]; norm_weight [v_dim];
    token_table [num_seqs, max_len] (flat row of each run position), query_lens [num_seqs] (the forward's
    attention metadata); states / snapshots: the layer's pool tensors (``conv`` [rows, width - 1,
    channels], ``recurrent`` [rows, v_heads, k_dim, v_dim] float32, snapshots [rows, verify_rows, ...]),
    updated in place -> [num_tokens, v_heads * v_dim] in the projections' dtype."""
    conv, rec = states["conv"], states["recurrent"]
    conv_snap, rec_snap = snapshots["conv"], snapshots["recurrent"]
    num_seqs, length = token_table.shape
    v_heads, keep = rec.shape[1], conv.shape[1]
    group = v_heads // num_k_heads
    tree = recurrent.parents is not None
    if tree and not recurrent.snapshots:
        raise ValueError("a draft tree is verified (snapshots), never written into the row")
    if recurrent.snapshots and length > rec_snap.shape[1]:
        raise ValueError(f"{length} verified tokens, the state snapshots hold {rec_snap.shape[1]}")
    for t in (conv, rec, conv_snap, rec_snap, conv_weight):
        assert t.is_contiguous()  # the pool's tensors and the conv parameter are allocated so
    for t in (rows.qkv, rows.z, rows.b, rows.a, token_table, recurrent.parents):
        assert t is None or t.stride(-1) == 1  # rows may be strided, their elements not
    # a padded run's padding rows (a captured prefill's: ``run_lens``) get zeros, which no program writes: the
    # layers after this one then read finite rows there (NaN left in them had reached the next layer's state and
    # a mixture's routing: tests/kernels/test_hybrid_kernels.py, the greedy tokens on the GPU)
    alloc = rows.qkv.new_empty if recurrent.run_lens is None else rows.qkv.new_zeros
    out = alloc(rows.qkv.shape[0], v_heads * head_v_dim)
    invariant = batch_invariant()
    # batch-invariant mode: never split (the split sets the reductions' layout, and it follows the batch)
    splits = 1 if invariant else value_splits(num_seqs, v_heads, head_v_dim, num_sms(out.device))
    if splits > 1:  # [num_tokens, v_heads, v_dim] the outputs before the norm
        o_part = out.new_empty(rows.qkv.shape[0], v_heads, head_v_dim, dtype=torch.float32)
        counters = zeroed_scratch(  # [num_seqs * v_heads] one a (sequence, value head)
            "layers/deltanet_step_kernel.py: the split step's arrival counters",
            out.device,
            num_seqs * v_heads,
            torch.int32,
        )
    else:
        o_part = counters = out  # not read
    in_row = not recurrent.snapshots or recurrent.last_row is not None
    if recurrent.last_row is not None and (tree or recurrent.last_row != length - 1):
        raise ValueError(
            f"a verify's state in the row after its last token (last_row {recurrent.last_row}) needs a chain "
            f"of {recurrent.last_row + 1} tokens a sequence, got {length}{' (a tree)' if tree else ''}"
        )
    qk_counters = out  # (read when the row is written: its q / k conv channels, module docstring)
    if in_row:
        qk_counters = zeroed_scratch(  # [num_seqs * k_heads] one a (sequence, key head)
            "layers/deltanet_step_kernel.py: the row write's key-head arrival counters",
            out.device,
            num_seqs * num_k_heads,
            torch.int32,
        )
    # bv: the value columns of one program
    bk, bv = triton.next_power_of_2(head_k_dim), triton.next_power_of_2(head_v_dim) // splits
    parents = recurrent.kernel_parents(token_table)
    bound = FUSED_MAX_LEN if invariant else length
    shape = dict(
        K_HEADS=num_k_heads,
        V_HEADS=v_heads,
        DK=head_k_dim,
        DV=head_v_dim,
        KEEP=keep,
        BK=bk,
        BW=triton.next_power_of_2(keep + 1),
        LENGTH=bound,
        SPECIALIZED=not invariant,
        BT=triton.next_power_of_2(bound),
    )
    ba = rows.ba_rows
    if ba is not None and (ba.x.stride(-1) != 1 or rows.b.shape[1] != ba.x.shape[1]):
        raise ValueError(
            f"b and a projected from rows {tuple(ba.x.shape)} (unit stride along them) by weights of "
            f"{rows.b.shape[1]} columns"
        )
    x_rows = out if ba is None else ba.x  # (not read without b and a from the rows)
    row_norm = ba is not None and ba.sq_parts is not None
    sq = ba.sq_parts if row_norm else out  # (not read without the norm)
    parts = sq.shape[0] if row_norm else 1
    pdl = pdl_available(out.device)
    kernel = _deltanet_step_any_form if invariant else _deltanet_step_kernel
    if num_seqs and length:
        kernel[(num_seqs, v_heads, splits)](
            rows.qkv,
            rows.qkv.stride(0),
            rows.q,
            rows.k,
            rows.qk_group,
            rows.v,
            rows.v_group,
            rows.z,
            rows.z.stride(0),
            rows.z_offset,
            rows.z_group,
            rows.b,
            rows.b.stride(0),
            rows.b_offset,
            rows.a,
            rows.a.stride(0),
            rows.a_offset,
            rows.ba_group,
            x_rows,
            x_rows.stride(0),
            sq,
            sq.stride(0),
            parts,
            0.0 if ba is None else ba.eps,
            x_rows.shape[1],
            conv_weight,
            A_log,
            dt_bias,
            norm_weight,
            token_table,
            token_table.stride(0),
            query_lens,
            recurrent.has_initial_state,
            recurrent.state_indices,
            parents,
            parents.stride(0),
            conv,
            rec,
            conv_snap,
            rec_snap,
            out,
            o_part,
            counters,
            qk_counters,
            rec_snap.shape[1],
            eps,
            head_k_dim**-0.5,
            length,
            int(tree),
            **shape,
            GROUP=group,
            BV=bv,
            TREE=tree,
            SNAPSHOTS=recurrent.snapshots,
            LAST_IN_ROW=recurrent.snapshots and recurrent.last_row is not None,
            SPLITS=splits,
            PDL=pdl,
            PREFETCH_LINES=max(1, bv // LINE_WORDS.value),
            BA_ROWS=ba is not None,
            ROW_NORM=row_norm,
            BH=BA_COLUMNS,
            BP=triton.next_power_of_2(parts),
            num_warps=num_warps(bk, bv),
            **pdl_launch_options(pdl),
            **invariant_launch_options(),
        )
    return out
