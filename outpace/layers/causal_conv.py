"""The short causal depthwise convolution in front of gated DeltaNet and Mamba2 mixers, over runs of
tokens (layers/recurrent.py) with an explicit state: the last ``width - 1`` inputs before the run.

Output at token t: sum over j of weight[c, j] * window_t[j, c] (+ bias[c]), where window_t is the
width inputs ending at t (transformers' causal_conv1d_fn: F.conv1d with width - 1 zeros of left
padding, which is the zero state). The state after token t is the last width - 1 rows of window_t.
In a draft tree, token t's window continues its parent's, not token t - 1's.
"""
from __future__ import annotations

import torch


def causal_conv_run(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    valid: torch.Tensor, parents: torch.Tensor | None, keep_every: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [runs, len, channels]; state [runs, width - 1, channels]; weight [channels, width]; valid [runs, len]
    (a prefix of each run); parents [runs, len] (-1: the state) or None (a chain) -> (y [runs, len,
    channels] before the activation, the state after each run's last valid token [runs, width - 1,
    channels], and with ``keep_every`` the state after every token [runs, len, width - 1, channels])."""
    if parents is not None:
        return _tree_conv(x, state, weight, bias, parents, keep_every)
    runs, length, _ = x.shape
    keep = weight.shape[1] - 1
    padded = torch.cat((state.to(x.dtype), x), dim=1)                     # [runs, keep + len, channels]
    windows = padded.unfold(1, keep + 1, 1)                               # [runs, len, channels, width]
    y = torch.einsum("stcw,cw->stc", windows, weight.to(x.dtype))
    if bias is not None:
        y = y + bias.to(x.dtype)
    ends = valid.sum(1)                                                   # [runs]: each run's valid tokens
    rows = ends[:, None] + torch.arange(keep, device=x.device)            # [runs, keep]
    final = padded.gather(1, rows[:, :, None].expand(-1, -1, x.shape[2]))
    every = windows[..., 1:].transpose(2, 3) if keep_every else None     # [runs, len, keep, channels]
    return y, final, every


def _tree_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               parents: torch.Tensor, keep_every: bool):
    """``causal_conv_run`` over a draft tree (every position valid): one token at a time, each window
    the parent's state plus the token."""
    runs, length, channels = x.shape
    row = torch.arange(runs, device=x.device)
    w = weight.to(x.dtype).t()                                           # [width, channels]
    stack = x.new_empty(runs, length + 1, w.shape[0] - 1, channels)      # [:, i + 1]: the state after token i
    stack[:, 0] = state
    y = torch.empty_like(x)
    for t in range(length):
        window = torch.cat((stack[row, parents[:, t] + 1], x[:, t:t + 1]), dim=1)  # [runs, width, channels]
        y[:, t] = (window * w).sum(1)
        stack[:, t + 1] = window[:, 1:]
    if bias is not None:
        y = y + bias.to(x.dtype)
    # (a tree is verified, never committed whole: its "last" state is only the last node's)
    return y, stack[:, -1], stack[:, 1:] if keep_every else None
