"""Split-K in the grouped-expert kernels (layers/moe_kernels.py, module docstring "Split-K"): K cut into splits,
a program a split (gate/up's float32 partials added by the tile's last program to arrive, down's by the
combine kernel) or one program walking them in turn, equals the unsplit kernels at odd shapes (hidden an odd
multiple of 16, the last split shorter and its last K step partial), 1 to 20 tokens, with shared experts,
skipped slots, relu2 ungated and block-FP8 stacks; gives the same bits twice and leaves its counters zero; in
batch-invariant mode a token's row has the same bits alone (a program a split) and among 7 tokens (one program
walking the same splits). And the plan: its counts at DeepSeek-V2-Lite's and Step-3.5-Flash's shapes on an
H200, one split over prefill's blocks, the counts of the mode. Triton's interpreter in float32 on the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers import moe_kernels as mk  # noqa: E402
from outpace.layers.quant.dequantize import quantize_fp8_block  # noqa: E402
from outpace.layers.quant.moe_quant_kernels import ExpertScales  # noqa: E402
from outpace.layers.zeroed_scratch import zeroed_scratch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
# 16-column K steps: hidden 208 is 13 steps, inter 136 is 8.5 (its last step partial)
TILES = ((32, 16, 4, 2), (64, 16, 4, 2))
HIDDEN, INTER, EXPERTS = 208, 136, 6


def _rand(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, DTYPE)


def stacks(gated: bool = True, shared: int = 0, seed: int = 0):
    """(gate or None, up, down) routed stacks of EXPERTS, and the shared ones (None without)."""
    routed = (
        _rand(EXPERTS, INTER, HIDDEN, seed=seed, scale=0.1) if gated else None,
        _rand(EXPERTS, INTER, HIDDEN, seed=seed + 1, scale=0.1),
        _rand(EXPERTS, HIDDEN, INTER, seed=seed + 2, scale=0.1),
    )
    if not shared:
        return routed, None
    return routed, (
        _rand(shared, INTER, HIDDEN, seed=seed + 3, scale=0.1) if gated else None,
        _rand(shared, INTER, HIDDEN, seed=seed + 4, scale=0.1),
        _rand(shared, HIDDEN, INTER, seed=seed + 5, scale=0.1),
    )


def routing(n: int, top_k: int, seed: int, skipped: bool = False):
    """(weights [n, top_k] float32, ids [n, top_k] int32): distinct experts a token; ``skipped``: each token's
    last slot another rank's expert (-1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:top_k] for _ in range(n)]).int()
    if skipped:
        ids[:, -1] = -1
    return torch.rand(n, top_k, generator=g).to(DEVICE), ids.to(DEVICE)


def fp8_stacks(seed: int):
    """Block-FP8 (gate, up, down) stacks of 64 x 64 scale blocks (ragged at hidden 208 and inter 136) and
    their scales (K steps of 16 columns lie in one scale column)."""
    weights, scales = [], []
    for shape, s in (
        ((EXPERTS, INTER, HIDDEN), 0),
        ((EXPERTS, INTER, HIDDEN), 1),
        ((EXPERTS, HIDDEN, INTER), 2),
    ):
        w, scale = quantize_fp8_block(_rand(*shape, seed=seed + s, scale=0.1).float(), (64, 64))
        weights.append(w.to(DEVICE))
        scales.append(scale.to(DEVICE))
    return weights, ExpertScales("fp8_block", (64, 64), *scales)


CASES = {  # id -> (gated, shared slots, skipped slots, activation, fp8)
    "silu": (True, 0, False, "silu", False),
    "silu-shared": (True, 2, False, "silu", False),
    "silu-skipped-shared": (True, 1, True, "silu", False),
    "relu2-ungated": (False, 1, False, "relu2", False),
    "fp8-block": (True, 0, True, "silu", True),
}


def run(case: str, n: int, splits: tuple[int, int] | None, seed: int = 0) -> torch.Tensor:
    gated, shared, skipped, activation, fp8 = CASES[case]
    weights, ids = routing(n, 3, seed=seed + n, skipped=skipped)
    x = _rand(n, HIDDEN, seed=seed + 100 + n)
    quant = None
    if fp8:
        routed, quant = fp8_stacks(seed)
        shared_stacks = None
    else:
        routed, shared_stacks = stacks(gated, shared, seed)
    return mk.grouped_experts(
        x, weights, ids, *routed, activation=activation, tiles=TILES, shared=shared_stacks,
        skipped_slots=skipped, quant=quant, splits=splits,
    )  # fmt: skip


@pytest.mark.parametrize("n", [1, 20])
@pytest.mark.parametrize("case", list(CASES))
def test_split_k_equals_the_unsplit_kernels(case, n):
    """Gate/up's 13 K steps in 2 (7 + 6), 3 (5 + 5 + 3) and 13 splits, down's 9 in 2 (5 + 4, the last
    step 8 columns) and 9: a split's partial dropped or added twice is a whole split's share off."""
    unsplit = run(case, n, (1, 1))
    for splits in ((2, 2), (3, 1), (13, 9)):
        torch.testing.assert_close(run(case, n, splits), unsplit, rtol=1e-5, atol=1e-5)


def test_split_k_gives_the_same_bits_twice_and_leaves_its_counters_zero():
    first = run("silu-skipped-shared", 7, (3, 2))
    assert torch.equal(run("silu-skipped-shared", 7, (3, 2)), first)
    counters = zeroed_scratch(
        "layers/moe_kernels.py: the gate/up split-K arrival counters",
        torch.device(DEVICE),
        mk._MAX_SPLIT_TILES,
        torch.int32,
    )
    assert not counters.any()


def test_a_tokens_row_in_the_mode_does_not_depend_on_the_batch():
    """Alone, token 0's launch splits gate/up and down among programs (on the CPU's 4 SMs of sm_count.py:
    4 blocks x 5 and x 4 column blocks, 2 splits each); among 7 tokens (8 blocks) the plan outside the mode
    would not split, so each program walks the same splits in turn: the same bits, first or last."""
    (gate, up, down), shared = stacks(shared=1, seed=7)
    n, top_k = 7, 3
    x = _rand(n, HIDDEN, seed=8)
    weights, ids = routing(n, top_k, seed=9)
    experts = EXPERTS + 1

    def rows(order: torch.Tensor) -> torch.Tensor:
        return mk.grouped_experts(
            x[order], weights[order], ids[order], gate, up, down, tiles=TILES, shared=shared
        )

    def plan(tokens: int) -> tuple[mk.SplitK, mk.SplitK]:
        layout = mk.BlockLayout.empty(tokens, top_k + 1, experts, DEVICE)
        tiles = (TILES[0][:2], TILES[1][:2])
        return mk.plan_splits(layout, top_k + 1, experts, HIDDEN, INTER, *tiles, x.device)

    with forward_settings(batch_invariant=True):
        alone, among = plan(1), plan(n)
        assert [s.count for s in alone] == [s.count for s in among] == [2, 2]
        assert all(s.programs for s in alone) and not any(s.programs for s in among)
        single = rows(torch.tensor([0], device=DEVICE))
        first = rows(torch.arange(n, device=DEVICE))
        last = rows(torch.tensor([*range(1, n), 0], device=DEVICE))
    assert torch.equal(first[:1], single) and torch.equal(last[-1:], single)
    outside = rows(torch.arange(n, device=DEVICE))  # (splits planned for 7 tokens: here one)
    torch.testing.assert_close(outside, first, rtol=1e-5, atol=1e-5)


def _h200_plan(monkeypatch, tokens, slots, experts, hidden, inter, block_k=128):
    monkeypatch.setattr(mk, "num_sms", lambda device: 132)
    layout = mk.BlockLayout.empty(tokens, slots, experts, "cpu")
    tiles = (mk.few_token_gate_up[0], block_k), (mk.few_token_down[0], block_k)
    return mk.plan_splits(layout, slots, experts, hidden, inter, *tiles, torch.device("cpu"))


def test_the_plan_at_one_token_on_an_h200(monkeypatch):
    """DeepSeek-V2-Lite (8 slots: top 6 + 2 shared, hidden 2048, inter 1408): gate/up 8 x 44 tiles over 16 K
    steps of 128 in 3 splits (6 + 6 + 4 steps: 1056 programs, 8 an SM), down 8 x 32 tiles over 11 steps in 2
    (6 + 5: at least 4 steps a split). Step-3.5-Flash (top 8 + 1 shared, hidden 4096, inter 1280): gate/up 9
    x 40 tiles over 32 steps in 3, down 9 x 64 over 10 steps in 2."""
    up, down = _h200_plan(monkeypatch, 1, 8, 66, 2048, 1408)
    assert (up.count, up.k_per_split, down.count, down.k_per_split) == (3, 768, 2, 768)
    assert up.programs and down.programs and (up.grid, down.grid) == (3, 2)
    up, down = _h200_plan(monkeypatch, 1, 9, 289, 4096, 1280)
    assert (up.count, up.k_per_split, down.count, down.k_per_split) == (3, 1408, 2, 640)


@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 16, 64, 65, 512])
def test_the_plan_over_the_token_counts(monkeypatch, tokens):
    """Fewer splits as the blocks fill the GPU, none over prefill's 64-row blocks; in batch-invariant mode the
    one-token counts at every token count, a program a split only where the plan outside the mode splits."""
    up, down = _h200_plan(monkeypatch, tokens, 8, 66, 2048, 1408)
    one_up, one_down = _h200_plan(monkeypatch, 1, 8, 66, 2048, 1408)
    assert one_up.count >= up.count >= 1 and one_down.count >= down.count >= 1
    for s in (up, down):
        assert s.programs == (s.count > 1)
        assert s.count == 1 or s.k_per_split >= 4 * 128  # (a last split may be shorter)
    if tokens > 64:
        assert (up.count, down.count) == (1, 1)
    with forward_settings(batch_invariant=True):
        fixed_up, fixed_down = _h200_plan(monkeypatch, tokens, 8, 66, 2048, 1408)
    assert (fixed_up, fixed_down) == (
        mk.SplitK(one_up.count, one_up.k_per_split, up.count > 1),
        mk.SplitK(one_down.count, one_down.k_per_split, down.count > 1),
    )


def test_refusals(monkeypatch):
    with pytest.raises(ValueError, match="at least one part"):
        run("silu", 2, (0, 1))
    monkeypatch.setattr(mk, "_MAX_SPLIT_TILES", 8)  # 20 tokens: 9 blocks x 5 column blocks
    with pytest.raises(ValueError, match="arrival counters hold 8"):
        run("silu", 20, (2, 1))
