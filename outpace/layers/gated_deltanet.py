"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next and Qwen3.5 (transformers'
Qwen3NextGatedDeltaNet and Qwen3_5GatedDeltaNet are the reference; the delta rule is
flash-linear-attention's ``fused_recurrent_gated_delta_rule``).

Per token, from the layer input: q, k (``num_k_heads`` x ``head_k_dim``) and v (``num_v_heads`` x
``head_v_dim``) through a short causal convolution (layers/causal_conv.py) and the activation; an output
gate z (like v); beta = sigmoid(b) and a decay g = -exp(A_log) * softplus(a + dt_bias) per value head.
q and k are L2-normalised (eps 1e-6 under the square root, as FLA's ``use_qk_l2norm_in_kernel``), q scaled
by head_k_dim ** -0.5, and each key head serves num_v_heads / num_k_heads consecutive value heads. The
state S [v_heads, head_k_dim, head_v_dim], float32, follows the delta rule:

    S <- S * exp(g);  S <- S + k (beta * (v - k^T S))^T;  o = q^T S

then o goes through an RMSNorm gated by silu(z) (the weight applied before the gate) and out_proj.

Two checkpoint layouts: Qwen3-Next packs q/k/v/z in ``in_proj_qkvz`` and b/a in ``in_proj_ba`` grouped by
key head ([q_h, k_h, v of its value heads, z of its value heads] per key head h); Qwen3.5 has
``in_proj_qkv`` (all q, all k, all v), ``in_proj_z``, ``in_proj_b`` and ``in_proj_a``. The convolution's
channels are all q, then all k, then all v in both.

Tensor parallelism (outpace/distributed/), as vLLM's and SGLang's Qwen3NextGatedDeltaNet shard it: key heads
split evenly over the ranks, each rank keeping whole key-head groups with their value heads (the value
heads split alike); the projections' q, k, v, z, b, a rows and the convolution's q, k, v channels follow,
each part sliced (distributed/packed.py); A_log and dt_bias per value head; the gated norm (per head_v_dim)
whole; out_proj row-parallel, its one all-reduce the layer's only collective. The state is this rank's heads'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from outpace.attention.context import get_forward_context
from outpace.attention.metadata import PagedAttentionMetadata
from outpace.distributed.group import build_group
from outpace.distributed.packed import (
    even_part,
    packed_column_parallel,
    packed_depthwise_conv,
    rows_of,
    sharded_vector,
)
from outpace.layers.activation import ACTIVATIONS
from outpace.layers.causal_conv import causal_conv_run
from outpace.layers.chunked_scans import delta_rule_chunked, use_chunked
from outpace.layers.linear import column_parallel, row_parallel
from outpace.layers.recurrent import RecurrentStateLayer, TokenRuns, rows_alone, scan_runs

if TYPE_CHECKING:
    from outpace.layers.decoder import PackedProjection
    from outpace.layers.deltanet_step_kernel import ProjectedRows


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [..., dim] / sqrt(sum of squares + eps) (FLA's l2norm; transformers' ``l2norm``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_rule_run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
    parents: torch.Tensor | None,
    keep_every: bool,
    kernel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The delta rule over runs of tokens (module docstring), one token at a time, in float32.

    q, k [runs, len, k_heads, k_dim] (not yet normalised); v [runs, len, v_heads, v_dim]; g, beta [runs,
    len, v_heads]; state [runs, v_heads, k_dim, v_dim] float32 before each run; valid [runs, len] (padding
    keeps the state); parents [runs, len] (-1: ``state``) or None (a chain) -> (o [runs, len, v_heads,
    v_dim] in v's dtype, the state after each run's last valid token, and with ``keep_every`` the state
    after every token [runs, len, v_heads, k_dim, v_dim]). ``kernel``: the loop as one Triton launch
    (layers/recurrent_kernels.py; None: on CUDA tensors), else this torch loop, the reference. With None a long
    prefill run on CUDA takes flash-linear-attention's chunked kernel (layers/chunked_scans.py)."""
    out_dtype = v.dtype
    q, k = (l2_normalize(x.float()) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    if kernel is None and use_chunked(
        v, v.shape[1], parents, keep_every
    ):  # layers/chunked_scans.py
        out, final = delta_rule_chunked(
            q, k, v.float(), g.float(), beta.float(), state.float(), valid
        )
        return out.to(out_dtype), final, None
    # (token by token in batch-invariant mode on the CPU: layers/recurrent.py)
    v, decay, beta = v.float(), rows_alone(torch.exp, g.float(), lead=2), beta.float()
    if v.is_cuda if kernel is None else kernel:  # one Triton launch (layers/recurrent_kernels.py)
        from outpace.layers.recurrent_kernels import delta_rule_scan

        out, final, every = delta_rule_scan(
            q, k, v, decay, beta, state.float(), valid, parents, keep_every
        )
        return out.to(out_dtype), final, every
    repeat = v.shape[2] // q.shape[2]
    q, k = (x.repeat_interleave(repeat, dim=2) for x in (q, k))

    def step(t: int, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = s * decay[:, t, :, None, None]
        k_t = k[:, t, :, :, None]  # [runs, heads, k_dim, 1]
        delta = (v[:, t] - (s * k_t).sum(-2)) * beta[:, t, :, None]  # [runs, heads, v_dim]
        s = s + k_t * delta[:, :, None, :]
        return s, (s * q[:, t, :, :, None]).sum(-2)

    out = torch.empty_like(v)
    final, every = scan_runs(state, valid, parents, keep_every, out, step)
    return out.to(out_dtype), final, every


class GatedRMSNorm(nn.Module):
    """RMSNorm over the last dim times its weight, then times silu(gate), in float32 (transformers
    Qwen3NextRMSNormGated: the weight multiplies after the cast back, the gate after it)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate [..., dim] -> [..., dim] in x's dtype."""
        xf = x.float()
        normed = self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype
        )
        return (normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(RecurrentStateLayer):
    """[num_tokens, hidden] -> [num_tokens, hidden]; its state per row: ``conv`` [conv_width - 1,
    conv_channels] in the model's dtype and ``recurrent`` [v_heads, k_dim, v_dim] float32.

    A served few-row step (runs of at most ``FUSED_MAX_LEN`` tokens: decode, verify) runs everything between
    the projections and out_proj as one kernel (layers/deltanet_step_kernel.py) when ``fused_step`` says so
    (None: on CUDA); the torch code below is the CPU path and its reference."""

    fused_step: bool | None = None
    # The in-projections as one matmul when served (layers/decoder.py ``pack_projections``): all of them, or where
    # they are stored in two formats as many of the first as pack (Qwen3.5-FP8: q/k/v and z, beside b and a in
    # bf16); x [n, hidden] -> one view per projection it packs.
    in_proj: PackedProjection | None = None

    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_width: int,
        eps: float,
        activation: str,
        packed_by_key_head: bool,
    ) -> None:
        """``packed_by_key_head``: Qwen3-Next's projections (in_proj_qkvz, in_proj_ba), else Qwen3.5's.
        Built in a tensor-parallel group (module docstring), the head counts and dims below are this rank's."""
        super().__init__()
        group = build_group()
        k_heads = even_part(num_k_heads, group, "linear_num_key_heads")
        v_heads = even_part(num_v_heads, group, "linear_num_value_heads")
        self.num_k_heads, self.num_v_heads = k_heads[2], v_heads[2]
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = self.num_k_heads * head_k_dim, self.num_v_heads * head_v_dim
        self.conv_channels = 2 * self.key_dim + self.value_dim
        self.activation = activation
        self.packed_by_key_head = packed_by_key_head
        keys, values = rows_of(k_heads, head_k_dim), rows_of(v_heads, head_v_dim)
        if (
            packed_by_key_head
        ):  # (packed per key head: an even split of the rows is whole key-head groups)
            self.in_proj_qkvz = column_parallel(
                hidden_size, 2 * keys[0] + 2 * values[0], what="linear_num_key_heads"
            )
            self.in_proj_ba = column_parallel(
                hidden_size, 2 * num_v_heads, what="linear_num_key_heads"
            )
        else:
            self.in_proj_qkv = packed_column_parallel(hidden_size, [keys, keys, values], group)
            self.in_proj_z = column_parallel(hidden_size, values[0], what="linear_num_value_heads")
            self.in_proj_b = column_parallel(
                hidden_size, num_v_heads, what="linear_num_value_heads"
            )
            self.in_proj_a = column_parallel(
                hidden_size, num_v_heads, what="linear_num_value_heads"
            )
        # the checkpoint's depthwise convolution [channels, 1, width]; causal_conv_run applies it
        self.conv1d = packed_depthwise_conv([keys, keys, values], conv_width, group, bias=False)
        self.dt_bias = sharded_vector(v_heads, 1.0, group)
        self.A_log = sharded_vector(v_heads, 0.0, group)
        self.norm = GatedRMSNorm(head_v_dim, eps)
        self.out_proj = row_parallel(
            values[0], hidden_size, what="linear_num_value_heads * linear_value_head_dim"
        )

    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        return {
            "conv": ((self.conv1d.kernel_size[0] - 1, self.conv_channels), None),
            "recurrent": ((self.num_v_heads, self.head_k_dim, self.head_v_dim), torch.float32),
        }

    def in_projections(self) -> list[nn.Linear]:
        """The checkpoint's in-projections of x, in the order ``in_proj`` packs them: Qwen3.5's qkv, z, b
        and a, or Qwen3-Next's qkvz and ba (packed by key head)."""
        if self.packed_by_key_head:
            return [self.in_proj_qkvz, self.in_proj_ba]
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def unpacked_projections(self) -> list[nn.Linear]:
        """The ``in_projections()`` that ``in_proj`` does not pack (all of them without it)."""
        return self.in_projections()[len(self.in_proj.sizes) if self.in_proj is not None else 0 :]

    def _in_projected(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [n, hidden] -> each of ``in_projections()`` of it [n, out_i]: those ``in_proj`` packs from its one
        matmul, the others one each."""
        packed = self.in_proj(x) if self.in_proj is not None else ()
        return (*packed, *(p(x) for p in self.unpacked_projections()))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [n, hidden] -> (conv input [n, channels]: all q, all k, all v; z [n, v_heads, v_dim]; b, a
        [n, v_heads])."""
        n = x.shape[0]
        if not self.packed_by_key_head:
            qkv, z, b, a = self._in_projected(x)
            return qkv, z.view(n, self.num_v_heads, self.head_v_dim), b, a
        per_group = self.num_v_heads // self.num_k_heads
        kd, vd = self.head_k_dim, per_group * self.head_v_dim
        qkvz, ba = self._in_projected(x)
        qkvz = qkvz.reshape(n, self.num_k_heads, 2 * kd + 2 * vd)
        q, k, v, z = qkvz.split([kd, kd, vd, vd], dim=-1)  # per key head
        b, a = ba.reshape(n, self.num_k_heads, 2 * per_group).split([per_group, per_group], dim=-1)
        mixed = torch.cat((q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)), dim=-1)
        return (
            mixed,
            z.reshape(n, self.num_v_heads, self.head_v_dim),
            b.reshape(n, -1),
            a.reshape(n, -1),
        )

    def _projected_rows(self, x: torch.Tensor) -> ProjectedRows:
        """The projections of x [n, hidden] as the step kernel reads them, in place (module docstring)."""
        return self._rows_of(self._in_projected(x))

    def _rows_of(self, projected: tuple[torch.Tensor, ...]) -> ProjectedRows:
        """``in_projections()``' outputs (or, for b and a, their weights: deltanet_step_kernel.py ``BaRows``,
        whose rows are those outputs' columns) as the step kernel reads them."""
        # (the kernel module imports Triton: only when used)
        from outpace.layers.deltanet_step_kernel import ProjectedRows

        kd, vd = self.head_k_dim, self.head_v_dim
        per_group = self.num_v_heads // self.num_k_heads
        if not self.packed_by_key_head:  # [all q, all k, all v], z like v, b and a [n, v_heads]
            qkv, z, b, a = projected
            return ProjectedRows(
                qkv, 0, self.key_dim, kd, 2 * self.key_dim, per_group * vd,
                z, 0, per_group * vd, b, 0, a, 0, per_group,
            )  # fmt: skip
        # per key head: [q, k, v of its value heads, z of its value heads] and [b of its heads, a of them]
        qkvz, ba = projected
        span = 2 * kd + 2 * per_group * vd
        return ProjectedRows(
            qkvz, 0, kd, span, 2 * kd, span,
            qkvz, 2 * kd + per_group * vd, span, ba, 0, ba, per_group, 2 * per_group,
        )  # fmt: skip

    def _takes_fused_step(self, x: torch.Tensor) -> bool:
        """Whether this forward is a served few-row step the kernel takes (class docstring): the state pool
        bound, paged runs of at most ``FUSED_MAX_LEN`` tokens, silu (the kernel's activation), and a
        tree only verified."""
        if not (x.is_cuda if self.fused_step is None else self.fused_step):
            return False
        from outpace.layers.deltanet_step_kernel import FUSED_MAX_LEN

        context = get_forward_context()
        recurrent, meta = context.recurrent, context.metadata
        return (
            recurrent is not None
            and self.states is not None
            and isinstance(meta, PagedAttentionMetadata)
            and meta.max_query_len <= FUSED_MAX_LEN
            and self.activation in ("silu", "swish")
            and (recurrent.parents is None or recurrent.snapshots)
        )

    def step_kernel(self, x) -> torch.Tensor:
        """The few-row step kernel (layers/deltanet_step_kernel.py) on x's in-projections (whatever
        ``_in_projected`` projects: the normalised rows [num_tokens, hidden] here) -> [num_tokens, value_dim],
        before out_proj."""
        from outpace.layers.deltanet_step_kernel import deltanet_step

        context = get_forward_context()
        return deltanet_step(
            self._projected_rows(x),
            self.conv1d.weight,
            self.A_log,
            self.dt_bias,
            self.norm.weight,
            self.norm.eps,
            context.metadata.token_table(),
            context.recurrent.valid_lens(context.metadata),
            context.recurrent,
            self.states,
            self.snapshots,
            self.num_k_heads,
            self.head_k_dim,
            self.head_v_dim,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, hidden] (normalised) -> [num_tokens, hidden]."""
        if self._takes_fused_step(x):
            return self.out_proj(self.step_kernel(x))
        runs = TokenRuns.of_context(x.device)
        mixed, z, b, a = self._project(x)
        start = self.initial_states(runs, x)
        parents, keep_every = self.parents(), self.keeps_every_state()
        conv, conv_final, conv_every = causal_conv_run(
            runs.gather(mixed),
            start["conv"],
            self.conv1d.weight[:, 0],
            None,
            runs.valid,
            parents,
            keep_every,
        )
        # (the elementwise steps token by token in batch-invariant mode on the CPU: layers/recurrent.py)
        conv = rows_alone(ACTIVATIONS[self.activation], conv, lead=2)  # [runs, len, channels]
        q, k, v = conv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        s, t = conv.shape[:2]
        g, beta = rows_alone(self._decay_and_beta, a, b)  # [num_tokens, v_heads] each
        o, final, every = gated_delta_rule_run(
            q.reshape(s, t, self.num_k_heads, self.head_k_dim),
            k.reshape(s, t, self.num_k_heads, self.head_k_dim),
            v.reshape(s, t, self.num_v_heads, self.head_v_dim),
            runs.gather(g),
            runs.gather(beta),
            start["recurrent"],
            runs.valid,
            parents,
            keep_every,
        )
        self.store(
            {"conv": conv_final, "recurrent": final},
            {"conv": conv_every, "recurrent": every} if keep_every else None,
        )
        o = rows_alone(self.norm, runs.scatter(o), z)  # [num_tokens, v_heads, v_dim]
        return self.out_proj(o.reshape(x.shape[0], self.value_dim))

    def _decay_and_beta(
        self, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """a, b [n, v_heads] -> (the log decay g, beta) [n, v_heads] (module docstring)."""
        return -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias), b.sigmoid()
