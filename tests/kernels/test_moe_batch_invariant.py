"""The MoE kernels in batch-invariant mode (EngineConfig.batch_invariant): a token's router logits (layers/
moe_routing_kernel.py ``router_logits``, their splits summed in order) and its grouped experts' output (layers/
grouped_experts.py) get the same bits alone and among many tokens, past the few-token paths'
bounds (16 tokens for the logits, 64 for the experts' blocks), and wherever the token sits in the batch. In
Triton's interpreter (float32, its dots row by row: tests/conftest.py) and on the GPU (bf16)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers.expert_blocks import block_rows  # noqa: E402
from outpace.layers.grouped_experts import grouped_experts  # noqa: E402
from outpace.layers.moe_kernels import expert_tiles, one_token_rows, pairs_apart  # noqa: E402
from outpace.layers.moe_routing_kernel import (  # noqa: E402
    router_logits,
    select_experts,
    token_route_warps,
)
from outpace.layers.router import Routing  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOKEN_COUNTS = (
    1,
    5,
    17,
    70,
)  # one, a few, past the logits' one token block, past the experts' small blocks


def _rand(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, DTYPE)


def _alone_and_among(fn) -> None:
    """fn(order) -> the rows of tokens ``order`` [n] computed in one call, [n, ...]: token 0's row alone, and
    first and last among the first ``count`` tokens for each count of TOKEN_COUNTS."""
    with forward_settings(batch_invariant=True):
        alone = fn(torch.tensor([0], device=DEVICE))
        for count in TOKEN_COUNTS[1:]:
            first = fn(torch.arange(count, device=DEVICE))
            last = fn(torch.tensor([*range(1, count), 0], device=DEVICE))
            assert torch.equal(first[:1], alone), count
            assert torch.equal(last[-1:], alone), count


def test_router_logits_of_a_token_do_not_depend_on_the_batch():
    hidden, experts = 200, 40
    x, w = _rand(max(TOKEN_COUNTS), hidden, seed=1), _rand(experts, hidden, seed=2).float()
    _alone_and_among(lambda order: router_logits(x[order], w).sum(0))  # the splits summed in order


@pytest.mark.parametrize("tokens", [17, 40])
def test_the_modes_router_logits_over_several_token_blocks_are_the_matvec(tokens):
    """The mode sums token by token at every count: each of several 16-token blocks' tokens gets its own
    row of x @ W.T, and with a column scale (Gemma 4's router input norm) its x^2 in the row's last entry."""
    hidden, experts = 300, 24
    x, w = _rand(tokens, hidden, seed=3), _rand(experts, hidden, seed=4).float()
    scale = _rand(hidden, seed=5)
    with forward_settings(batch_invariant=True):
        plain = router_logits(x, w).sum(0)
        normed = router_logits(x, w, column_scale=scale).sum(0)
    xf = x.float()
    torch.testing.assert_close(plain, xf @ w.T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        normed[:, :experts], (xf * scale.float()) @ w.T, rtol=1e-5, atol=1e-4
    )
    torch.testing.assert_close(normed[:, experts], xf.pow(2).sum(1), rtol=1e-5, atol=1e-4)


def test_grouped_experts_of_a_token_do_not_depend_on_the_batch():
    hidden, inter, experts, top_k, n = 96, 48, 6, 2, max(TOKEN_COUNTS)
    x = _rand(n, hidden, seed=3)
    gate = _rand(experts, inter, hidden, seed=4, scale=0.1)
    up = _rand(experts, inter, hidden, seed=5, scale=0.1)
    down = _rand(experts, hidden, inter, seed=6, scale=0.1)
    g = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(n)]).to(DEVICE)
    weights = torch.rand(n, top_k, generator=g).to(DEVICE)
    _alone_and_among(
        lambda order: grouped_experts(x[order], weights[order], ids[order].int(), gate, up, down)
    )


def test_a_readied_token_does_not_depend_on_the_batch(monkeypatch):
    """``ready`` (the output added to the stream and readied for the next norm): the stream, its normed rows and
    its parts of the sum of squares, alone and among many. The combine's column blocks (the parts) follow
    the token count outside the mode (grouped_experts.py ``_combine_block``): with 2 SMs, 512 columns take 4 blocks
    at one token and one at 16 (an H200's 132 SMs at DeepSeek-V2-Lite's 2048 columns: 16 and 8)."""
    from outpace.layers import grouped_experts as launcher

    monkeypatch.setattr(launcher, "num_sms", lambda device: 2)
    hidden, inter, experts, top_k, n = 512, 16, 6, 2, max(TOKEN_COUNTS)
    x, stream = _rand(n, hidden, seed=9), _rand(n, hidden, seed=10)
    norm_weight = _rand(hidden, seed=11)
    gate, up = (_rand(experts, inter, hidden, seed=s, scale=0.1) for s in (12, 13))
    down = _rand(experts, hidden, inter, seed=14, scale=0.1)
    g = torch.Generator().manual_seed(15)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(n)]).to(DEVICE)
    weights = torch.rand(n, top_k, generator=g).to(DEVICE)

    def readied(order: torch.Tensor) -> torch.Tensor:
        rows = grouped_experts(
            x[order], weights[order], ids[order].int(), gate, up, down,
            ready=(stream[order], norm_weight, 1.0),
        )  # fmt: skip
        parts = rows.sq_parts.T.to(
            rows.stream.dtype
        )  # [tokens, parts] (float32 in the interpreter)
        return torch.cat([rows.stream, rows.normed, parts], dim=1)

    _alone_and_among(readied)


@pytest.mark.parametrize(
    "routing",
    [Routing(40, 6, "softmax"), Routing(32, 4, "sigmoid", 4, 2, "top2_sum", True, True, 2.5)],
    ids=["softmax", "grouped_sigmoid_bias"],
)
def test_a_tokens_routing_does_not_depend_on_the_batch(routing):
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(2, max(TOKEN_COUNTS), routing.num_experts, generator=g).to(
        DEVICE
    )  # 2 splits
    bias = (
        torch.randn(routing.num_experts, generator=g).to(DEVICE)
        if routing.correction_bias
        else None
    )

    def routed(order: torch.Tensor) -> torch.Tensor:
        weights, ids, _ = select_experts(logits[:, order], bias, routing)
        return torch.cat([weights, ids.float()], dim=1)

    _alone_and_among(routed)


def test_the_route_warps_do_not_depend_on_the_token_count_in_the_mode():
    """A token's program reduces over its experts across the kernel's warps, so its weights' bits follow them:
    in the mode they are a decode step's at every count; outside it more past 64 tokens (the last program
    places 65 to 128 tokens' pairs), none past 256 experts (their 4 already)."""
    for experts in (64, 256, 512):
        one = token_route_warps(experts)
        with forward_settings(batch_invariant=True):
            assert {token_route_warps(experts, n) for n in (1, 64, 65, 128, 4096)} == {one}
        assert token_route_warps(experts, 64) == one
    assert token_route_warps(64, 65) == token_route_warps(256, 128) == 8
    assert token_route_warps(512, 128) == 4


def test_the_expert_tiles_do_not_depend_on_the_token_count_in_the_mode():
    """What the kernels' K order follows, in each format (the interpreter's float32 tiles are one set for every count); one
    token's block-FP8 rows stay in the 16-row tiles too (not on the CUDA cores, moe_kernels.py ONE-ROW), and a few
    tokens' pairs in the layout's blocks (PAIRS APART)."""
    with forward_settings(batch_invariant=True):
        for fmt in ("none", "fp8_block", "int4_group"):
            assert {expert_tiles(block_rows(n), False, fmt) for n in (1, 64, 65, 4096)} == {
                expert_tiles(block_rows(1), False, fmt)
            }
        assert not one_token_rows(1, "fp8_block", 2048)
        assert not pairs_apart(2, "int4_group", 7168, 2048)  # (nor a few tokens' pairs apart)
    assert block_rows(65) != block_rows(1)  # (outside the mode, prefill takes larger blocks)
    assert one_token_rows(1, "fp8_block", 2048) and pairs_apart(2, "int4_group", 7168, 2048)
