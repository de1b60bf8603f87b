"""The short causal depthwise convolution in front of gated DeltaNet and Mamba2 mixers, over runs of
tokens (layers/recurrent.py) with an explicit state: the last ``width - 1`` inputs before the run.

Output at token t: sum over j of weight[c, j] * window_t[j, c] (+ bias[c]), where window_t is the
width inputs ending at t (transformers' causal_conv1d_fn: F.conv1d with width - 1 zeros of left
padding, which is the zero state). The state after token t is the last width - 1 rows of window_t.
In a draft tree, token t's window continues its parent's, not token t - 1's.

Batch-invariant mode (attention/context.py ``batch_invariant``): the window sum runs in window order, an
elementwise product and sum per tap, so a token's output does not depend on how many tokens share the call
(the einsum's matrix product picks its kernel, hence its order of summation, by the shape).
"""

from __future__ import annotations

import torch

from outpace.attention.context import batch_invariant


def causal_conv_run(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    valid: torch.Tensor,
    parents: torch.Tensor | None,
    keep_every: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [runs, len, channels]; state [runs, width - 1, channels]; weight [channels, width]; valid [runs, len]
    (a prefix of each run); parents [runs, len] (-1: the state) or None (a chain) -> (y [runs, len,
    channels] before the activation, the state after each run's last valid token [runs, width - 1,
    channels], and with ``keep_every`` the state after every token [runs, len, width - 1, channels])."""
    if parents is not None:
        return _tree_conv(x, state, weight, bias, parents, keep_every)
    runs, length, _ = x.shape
    keep = weight.shape[1] - 1
    padded = torch.cat((state.to(x.dtype), x), dim=1)  # [runs, keep + len, channels]
    windows = padded.unfold(1, keep + 1, 1)  # [runs, len, channels, width]
    y = _weighted_windows(windows, weight.to(x.dtype), "stcw")
    if bias is not None:
        y = y + bias.to(x.dtype)
    ends = valid.sum(1)  # [runs]: each run's valid tokens
    rows = ends[:, None] + torch.arange(keep, device=x.device)  # [runs, keep]
    final = padded.gather(1, rows[:, :, None].expand(-1, -1, x.shape[2]))
    every = windows[..., 1:].transpose(2, 3) if keep_every else None  # [runs, len, keep, channels]
    return y, final, every


def _tree_conv(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    parents: torch.Tensor,
    keep_every: bool,
):
    """``causal_conv_run`` over a draft tree (every position valid): each node's window is its root path's
    last ``width - 1`` inputs (reaching into the state above the root) and its own.

    Over the run's extended inputs [state rows (oldest first), nodes], each position's predecessor is its
    parent node, the last state row for a root, the previous row for a state row; a node's window is the
    node and its ``width - 1`` predecessors, so it is gathered in ``width - 1`` steps, not node by node."""
    runs, length, channels = x.shape
    keep = weight.shape[1] - 1
    extended = torch.cat((state.to(x.dtype), x), dim=1)  # [runs, keep + len, channels]
    node_before = torch.where(parents >= 0, parents + keep, keep - 1)  # [runs, len]
    state_before = (torch.arange(keep, device=x.device) - 1).clamp(min=0).expand(runs, keep)
    before = torch.cat((state_before, node_before), dim=1)  # [runs, keep + len]
    index = [torch.arange(keep, keep + length, device=x.device).expand(runs, length)]
    for _ in range(keep):
        index.append(before.gather(1, index[-1]))
    index = torch.stack(index[::-1], dim=2)  # [runs, len, width]: oldest first
    windows = extended.gather(1, index.reshape(runs, -1, 1).expand(-1, -1, channels)).view(
        runs, length, keep + 1, channels
    )
    y = _weighted_windows(windows, weight.to(x.dtype), "stwc")
    if bias is not None:
        y = y + bias.to(x.dtype)
    every = windows[:, :, 1:]  # [runs, len, keep, channels]
    # (a tree is verified, never committed whole: its "last" state is only the last node's)
    return y, every[:, -1], every if keep_every else None


def _weighted_windows(windows: torch.Tensor, weight: torch.Tensor, layout: str) -> torch.Tensor:
    """windows [runs, len, channels, width] (``layout`` "stcw") or [runs, len, width, channels] ("stwc")
    times weight [channels, width], summed over the window -> [runs, len, channels]; in batch-invariant
    mode tap by tap, oldest first (module docstring)."""
    if not batch_invariant():
        return torch.einsum(f"{layout},cw->stc", windows, weight)
    taps = windows.unbind(layout.index("w"))  # width x [runs, len, channels]
    y = taps[0] * weight[:, 0]
    for tap, w in zip(taps[1:], weight.unbind(1)[1:]):
        y = y + tap * w
    return y
