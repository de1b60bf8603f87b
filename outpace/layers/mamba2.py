"""The Mamba2 mixer of Nemotron-H (transformers' NemotronHMamba2Mixer is the reference; the recurrence is
mamba_ssm's ``selective_state_update``).

From the layer input, one projection gives a gate z [heads * head_dim], the convolution's input (x
[heads * head_dim], B and C [groups * state_size] each) and dt [heads]. x, B, C go through a short causal
convolution (layers/causal_conv.py, with bias) and the activation. Per head h (group h // (heads /
groups)), with dt = clamp(softplus(dt + dt_bias), time_step_min) and A = -exp(A_log):

    S <- S * exp(dt A) + dt x B^T;  y = S C + D x         (S [head_dim, state_size], float32)

then y * silu(z) goes through an RMSNorm over groups of heads * head_dim / groups channels (the gate
before the norm: mamba_ssm's norm_before_gate=False) and out_proj.

NOTE: transformers clamps dt from below by ``time_step_min`` in its chunked (prefill) scan and not in its
single-token update; here every path clamps, so prefill and decode compute the same function.

Tensor parallelism (outpace/distributed/), as vLLM's MambaMixer2 shards it: heads split evenly over the
ranks, and groups too when there are at least as many as ranks, else each group is replicated on the
ranks of its heads (size / groups consecutive ranks; the size must be a multiple of the groups); the
projection's z, x, B, C and dt rows and the convolution's x, B, C channels follow, each part sliced
(distributed/packed.py); A_log, dt_bias, D and the norm weight per head; the gated norm over each rank's
groups; out_proj row-parallel, its one all-reduce the layer's only collective (plus a gather in the norm
when a group spans ranks). The state is this rank's heads'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from outpace.attention.context import get_forward_context
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.distributed.collectives import all_gather_last_dim
from outpace.distributed.group import RankGroup, build_group
from outpace.distributed.packed import (
    Part,
    even_part,
    packed_column_parallel,
    packed_depthwise_conv,
    rows_of,
    sharded_vector,
)
from outpace.distributed.sharding import kv_head_shard
from outpace.layers.activation import ACTIVATIONS
from outpace.layers.causal_conv import causal_conv_run
from outpace.layers.chunked_scans import ssm_chunked, use_chunked
from outpace.layers.linear import row_parallel
from outpace.layers.recurrent import RecurrentStateLayer, TokenRuns, rows_alone, scan_runs

# The longest run the fused step takes (a verify's draft tokens); longer runs are prefill's.
FUSED_MAX_LEN = 16


def ssm_run(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
    parents: torch.Tensor | None,
    keep_every: bool,
    kernel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The selective scan over runs of tokens (module docstring), one token at a time, in float32.

    x [runs, len, heads, head_dim]; dt [runs, len, heads] (discretisation steps, final); A, D [heads];
    B, C [runs, len, groups, state_size]; state [runs, heads, head_dim, state_size] float32; valid,
    parents as in layers/recurrent.py -> (y [runs, len, heads, head_dim] in x's dtype, the state after
    each run's last valid token, and with ``keep_every`` the state after every token). ``kernel``: the loop
    as one Triton launch (layers/recurrent_kernels.py; None: on CUDA tensors), else this torch loop. With None a long
    prefill run on CUDA takes flash-linear-attention's chunked kernel (layers/chunked_scans.py)."""
    out_dtype = x.dtype
    x, dt = x.float(), dt.float()
    if kernel is None and use_chunked(
        x, x.shape[1], parents, keep_every
    ):  # layers/chunked_scans.py
        y, final = ssm_chunked(
            x, dt, A.float(), B.float(), C.float(), D.float(), state.float(), valid
        )
        return y.to(out_dtype), final, None
    # [runs, len, heads] (token by token in batch-invariant mode on the CPU: layers/recurrent.py)
    decay = rows_alone(lambda d: (d * A.float()).exp(), dt, lead=2)
    if x.is_cuda if kernel is None else kernel:  # one Triton launch (layers/recurrent_kernels.py)
        from outpace.layers.recurrent_kernels import ssm_scan

        y, final, every = ssm_scan(
            x, dt, decay, B.float(), C.float(), D.float(), state.float(), valid, parents, keep_every
        )
        return y.to(out_dtype), final, every
    repeat = x.shape[2] // B.shape[2]
    B, C = (
        t.float().repeat_interleave(repeat, dim=2) for t in (B, C)
    )  # [runs, len, heads, state_size]

    def step(t: int, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = (
            s * decay[:, t, :, None, None]
            + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        )
        return s, (s * C[:, t, :, None, :]).sum(-1) + D.float()[:, None] * x[:, t]

    y = torch.empty_like(x)
    final, every = scan_runs(state, valid, parents, keep_every, y, step)
    return y.to(out_dtype), final, every


class GroupedGatedRMSNorm(nn.Module):
    """x * silu(gate), then RMSNorm over each group of ``group_size`` channels, times the weight, in
    float32 (transformers NemotronHRMSNormGated). Tensor-parallel: x holds this rank's channels; when a
    group spans several ranks (fewer groups than ranks) the channels are gathered, normalised and this
    rank's taken back (vLLM Mixer2RMSNormGated's general case)."""

    def __init__(self, channels: Part, group_size: int, eps: float, group: RankGroup) -> None:
        super().__init__()
        self.group_size, self.eps, self.group = group_size, eps, group
        self.weight = sharded_vector(channels, 1.0, group)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate [n, dim] -> [n, dim] in x's dtype."""
        h = x.float() * F.silu(gate.float())  # [n, dim]
        spans = self.group_size > h.shape[1]
        if spans:
            h = all_gather_last_dim(h, self.group)  # [n, size * dim]
        grouped = h.view(x.shape[0], -1, self.group_size)  # [n, groups, group_size]
        h = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)).view_as(h)
        if spans:
            h = h[:, self.group.rank * x.shape[1] : (self.group.rank + 1) * x.shape[1]]
        return self.weight * h.to(x.dtype)


class Mamba2Mixer(RecurrentStateLayer):
    """[num_tokens, hidden] -> [num_tokens, hidden]; its state per row: ``conv`` [conv_width - 1,
    conv_channels] in the model's dtype and ``ssm`` [heads, head_dim, state_size] float32.

    A few-row step (decode, verify: runs of at most ``FUSED_MAX_LEN`` tokens reading and writing bound
    state rows) goes from in_proj to out_proj in two Triton launches (layers/mamba2_step_kernel.py) when
    ``fused`` says so (None: on CUDA); prefill, references and the CPU take the eager path below."""

    fused: bool | None = None
    # A verify's chain end stays out of the row (layers/recurrent.py): in the step kernel's second launch the
    # token programs that read the old convolution window would race the one that rewrote it.
    chain_end_in_row = False

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        num_groups: int,
        state_size: int,
        conv_width: int,
        conv_bias: bool,
        proj_bias: bool,
        activation: str,
        time_step_min: float,
        eps: float,
    ) -> None:
        """Built in a tensor-parallel group (module docstring), the counts below are this rank's."""
        super().__init__()
        group = build_group()
        heads = even_part(num_heads, group, "mamba_num_heads")
        first_group, local_groups = kv_head_shard(num_groups, group.rank, group.size, "n_groups")
        self.num_heads, self.head_dim, self.num_groups, self.state_size = (
            heads[2],
            head_dim,
            local_groups,
            state_size,
        )
        self.inner = self.num_heads * head_dim
        inner = rows_of(heads, head_dim)  # x (and z) channels
        groups = rows_of((num_groups, first_group, local_groups), state_size)  # B (and C) channels
        self.conv_channels = self.inner + 2 * groups[2]
        self.activation, self.time_step_min = activation, time_step_min
        self.in_proj = packed_column_parallel(
            hidden_size, [inner, inner, groups, groups, heads], group, proj_bias
        )
        # the checkpoint's depthwise convolution [channels, 1, width] (+ bias); causal_conv_run applies it
        self.conv1d = packed_depthwise_conv([inner, groups, groups], conv_width, group, conv_bias)
        self.dt_bias = sharded_vector(heads, 1.0, group)
        self.A_log = sharded_vector(heads, 0.0, group)
        self.D = sharded_vector(heads, 1.0, group)
        self.norm = GroupedGatedRMSNorm(inner, num_heads * head_dim // num_groups, eps, group)
        self.out_proj = row_parallel(
            inner[0], hidden_size, proj_bias, "mamba_num_heads * mamba_head_dim"
        )

    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        return {
            "conv": ((self.conv1d.kernel_size[0] - 1, self.conv_channels), None),
            "ssm": ((self.num_heads, self.head_dim, self.state_size), torch.float32),
        }

    def takes_fused_step(self, x: torch.Tensor) -> bool:
        """Whether this forward is a step the fused kernels serve (class docstring): paged runs of at most
        FUSED_MAX_LEN tokens with bound state rows (a tree only in a verify), the SiLU activation, and
        norm groups within this rank's channels."""
        ctx = get_forward_context()
        recurrent = ctx.recurrent
        return (
            (x.is_cuda if self.fused is None else self.fused)
            and isinstance(ctx.metadata, PagedAttentionMetadata)
            and ctx.metadata.max_query_len <= FUSED_MAX_LEN
            and recurrent is not None
            and self.states is not None
            and (recurrent.parents is None or recurrent.snapshots)
            and self.activation in ("silu", "swish")
            and self.inner == self.num_groups * self.norm.group_size
        )

    def step_kernel(self, zxbcdt: torch.Tensor) -> torch.Tensor:
        """The few-row step (two launches: layers/mamba2_step_kernel.py) from in_proj's output zxbcdt
        [num_tokens, inner + conv_channels + heads] -> y [num_tokens, inner], before out_proj."""
        from outpace.layers.mamba2_step_kernel import mamba2_step

        ctx = get_forward_context()
        meta = ctx.metadata
        return mamba2_step(
            self, zxbcdt, meta.token_table(), ctx.recurrent.valid_lens(meta), ctx.recurrent
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, hidden] (normalised) -> [num_tokens, hidden]."""
        zxbcdt = self.in_proj(x)  # [num_tokens, inner + conv_channels + heads]
        if self.takes_fused_step(x):
            return self.out_proj(self.step_kernel(zxbcdt))
        runs = TokenRuns.of_context(x.device)
        gate, xbc, dt = zxbcdt.split([self.inner, self.conv_channels, self.num_heads], dim=-1)
        start = self.initial_states(runs, x)
        parents, keep_every = self.parents(), self.keeps_every_state()
        conv, conv_final, conv_every = causal_conv_run(
            runs.gather(xbc),
            start["conv"],
            self.conv1d.weight[:, 0],
            self.conv1d.bias,
            runs.valid,
            parents,
            keep_every,
        )
        # (the elementwise steps token by token in batch-invariant mode on the CPU: layers/recurrent.py)
        conv = rows_alone(ACTIVATIONS[self.activation], conv, lead=2)  # [runs, len, channels]
        groups = self.num_groups * self.state_size
        xs, B, C = conv.split([self.inner, groups, groups], dim=-1)
        s, t = conv.shape[:2]
        dt = rows_alone(self._time_step, dt)  # [num_tokens, heads]
        y, final, every = ssm_run(
            xs.reshape(s, t, self.num_heads, self.head_dim),
            runs.gather(dt),
            -self.A_log.float().exp(),
            B.reshape(s, t, self.num_groups, self.state_size),
            C.reshape(s, t, self.num_groups, self.state_size),
            self.D,
            start["ssm"],
            runs.valid,
            parents,
            keep_every,
        )
        self.store(
            {"conv": conv_final, "ssm": final},
            {"conv": conv_every, "ssm": every} if keep_every else None,
        )
        y = rows_alone(self.norm, runs.scatter(y).reshape(x.shape[0], self.inner), gate)
        return self.out_proj(y)

    def _time_step(self, dt: torch.Tensor) -> torch.Tensor:
        """dt [n, heads] as projected -> the discretisation step (module docstring)."""
        return F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.time_step_min)
