"""Expert parallelism's pieces in one process (no collectives run): the placement of experts over ranks and
its refusal of a count that does not split, each rank's checkpoint reads (its experts only, the others'
tensors skipped unread), and the routed experts' partial outputs, on the eager path and on the grouped kernels
(Triton's interpreter on the CPU), summing over the ranks to the one-rank output; a rank's MoE block on the
kernels routes straight into its own experts' block layout (layers/moe_routing_kernel.py docstring 4.). The
engine-level checks (greedy tokens of whole families) are tests/distributed/test_expert_parallel.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.deepseek_models import make_hf_deepseek
from helpers.hf_models import save_hf_model
from helpers.step3p5_checkpoints import CONFIG as STEP_CONFIG
from helpers.step3p5_checkpoints import moe_layers, write_checkpoint
from outpace import checkpoint
from outpace.checkpoint import load_checkpoint
from outpace.distributed.group import RankGroup, build_expert_group, build_group, building_in
from outpace.distributed.sharding import ShardingError
from outpace.layers.moe import ExpertPlacement, FusedShared
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# 12 experts in 4 groups: they split over 2, 3 and 4 ranks
DEEPSEEK = dict(
    num_attention_heads=6, num_key_value_heads=6, intermediate_size=96, n_routed_experts=12
)


def ep_group(rank: int, size: int, tp: bool) -> RankGroup:
    """Rank ``rank`` of an expert-parallel group of ``size``, tensor parallel too when ``tp`` (EP = TP)."""
    return RankGroup(rank, size, tensor_parallel=tp, expert_parallel=True)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("ep-layers")
    return str(save_hf_model(make_hf_deepseek("v3-yarn", **DEEPSEEK), root / "v3"))


def build(path: str, group: RankGroup, reads: list | None = None):
    with building_in(group):
        model = build_model(ModelConfig.from_pretrained(path), torch.float32)
    load_checkpoint(model, path, progress=False)
    return model


def test_parts_of_a_group():
    both, experts_only = ep_group(1, 3, True), ep_group(1, 3, False)
    with building_in(both):
        assert build_group() is both and build_expert_group() is both
    with building_in(experts_only):
        assert build_group().size == 1 and build_expert_group() is experts_only
    with building_in(RankGroup(1, 3)):  # tensor parallel only
        assert build_group().size == 3 and build_expert_group() is None


def test_experts_are_placed_in_contiguous_ranges_and_a_count_that_does_not_split_is_refused():
    with building_in(ep_group(2, 3, False)):
        p = ExpertPlacement.building(12)
        assert (p.first, p.count, p.reduces_itself) == (8, 4, True)
        ids = torch.tensor([[0, 8, 11], [7, 9, 12]])
        assert p.local_ids(ids).tolist() == [[-1, 0, 3], [-1, 1, -1]]
        with pytest.raises(
            ShardingError, match="10 routed experts do not split over expert_parallel_size=3"
        ):
            ExpertPlacement.building(10)
    with building_in(ep_group(1, 2, True)):
        assert not ExpertPlacement.building(12).reduces_itself


def test_each_rank_reads_only_its_experts(deepseek, monkeypatch):
    """Rank r of 3 holds experts 4r .. 4r + 3, whole, under their checkpoint names, equal to the one-rank
    model's; the other experts' tensors are never read; the shared experts split as under TP with EP = TP
    and are whole with TP = 1."""
    whole = build(deepseek, RankGroup(0, 1)).model.layers[1].mlp
    read: list[str] = []
    real = checkpoint._read
    monkeypatch.setattr(
        checkpoint, "_read", lambda f, name, *a: read.append(name) or real(f, name, *a)
    )
    for tp in (True, False):
        for rank in range(3):
            read.clear()
            moe = build(deepseek, ep_group(rank, 3, tp)).model.layers[1].mlp
            names = {n for n, _ in moe.experts.named_parameters()}
            assert {n.split(".")[0] for n in names} == {
                str(e) for e in range(4 * rank, 4 * rank + 4)
            }
            for e in range(4):
                mine, full = moe.experts[e], whole.experts[4 * rank + e]
                assert torch.equal(mine.gate_proj.weight, full.gate_proj.weight)
                assert torch.equal(mine.down_proj.weight, full.down_proj.weight)
            experts_read = {
                n.split(".mlp.experts.")[1].split(".")[0] for n in read if ".mlp.experts." in n
            }
            assert experts_read == {str(e) for e in range(4 * rank, 4 * rank + 4)}
            shared = moe.shared_experts.up_proj.weight.shape[0]
            assert shared == (24 // 3 if tp else 24)


def test_stacked_experts_read_their_slice(tmp_path):
    """Step-3.5's stacked [experts, out, in] tensors: rank r of 2 reads rows r * E / 2 .. of dim 0, whole."""
    cfg = {**STEP_CONFIG, "moe_num_experts": 4}
    path, _ = write_checkpoint(tmp_path, cfg)
    layer = min(moe_layers(cfg))
    whole = build(str(path), RankGroup(0, 1)).model.layers[layer].moe
    for rank in range(2):
        moe = build(str(path), ep_group(rank, 2, True)).model.layers[layer].moe
        for name in ("gate_proj", "up_proj", "down_proj"):
            got, full = getattr(moe, name).weight, getattr(whole, name).weight
            assert torch.equal(got, full[2 * rank : 2 * rank + 2])


@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("size", [2, 3])
def test_partial_outputs_sum_to_the_one_rank_output(deepseek, size, kernels):
    """Each rank's routed experts over every token (others' slots skipped), summed over the ranks, give the
    one-rank experts' output: eagerly and on the grouped kernels (the skipped slots' rows zeroed), with the
    shared experts fused in on one rank (EP = TP keeps the fusion; its partial sums then sum too)."""
    torch.manual_seed(0)
    x = torch.randn(7, 48, device=DEVICE)
    whole = build(deepseek, RankGroup(0, 1)).model.layers[1].mlp.to(DEVICE)
    whole.experts.kernels = kernels
    weights, ids = whole.gate(x)
    expected = whole.experts(x, weights, ids)
    parts = []
    for rank in range(size):
        moe = build(deepseek, ep_group(rank, size, True)).model.layers[1].mlp.to(DEVICE)
        moe.experts.kernels = kernels
        parts.append(moe.experts(x, weights, ids))
    torch.testing.assert_close(sum(parts), expected, rtol=1e-5, atol=1e-5)


def refuse_eager_routing(monkeypatch, tokens: int) -> None:
    """Make the torch routing steps a rank's kernel path must not take raise: ``ExpertPlacement.local_ids``,
    ``align`` inside the grouped kernels and, up to 64 tokens (the routing kernel lays out), the routing's
    own ``align``."""
    from outpace.layers import grouped_experts, moe_routing_kernel

    def refused(*_args, **_kwargs):
        raise AssertionError("an expert-parallel rank's routing took an eager step")

    monkeypatch.setattr(ExpertPlacement, "local_ids", refused)
    monkeypatch.setattr(grouped_experts, "align", refused)
    if tokens <= moe_routing_kernel.FUSED_LAYOUT_TOKENS:
        monkeypatch.setattr(moe_routing_kernel, "align", refused)


@pytest.mark.parametrize("tokens", [7, 70])
@pytest.mark.parametrize("size", [2, 3])
def test_a_ranks_moe_block_on_the_kernels_routes_into_its_own_layout(
    deepseek, size, tokens, monkeypatch
):
    """DeepSeek-V3's block at EP = TP on the kernels (router kernel included): each rank's routing kernel
    writes the layout of its own experts (no torch step between it and the grouped kernels; beyond 64 tokens
    ``align`` of the kernel's local ids), and the ranks' partial outputs, the shared experts' rows beside,
    sum to the one-rank block's."""
    x = torch.randn(
        tokens, 48, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(tokens)
    )
    groups = [RankGroup(0, 1)] + [ep_group(rank, size, True) for rank in range(size)]
    blocks = [build(deepseek, g).model.layers[1].mlp.to(DEVICE) for g in groups]
    for block in blocks:
        block.gate.kernel = block.experts.kernels = True
    expected = blocks[0].grouped(x)
    refuse_eager_routing(monkeypatch, tokens)
    parts = [block.grouped(x) for block in blocks[1:]]
    torch.testing.assert_close(sum(parts), expected, rtol=1e-5, atol=1e-5)


def test_a_ranks_fused_shared_slot_is_in_its_layout(tmp_path, monkeypatch):
    """Step-3.5 at EP = TP = 2 with a shared expert two routed experts wide (and their clamp): each rank's half
    of it is one fused shared slot, local expert 2 of its layout beside its 2 routed experts; the ranks'
    outputs sum to the one-rank layer's (2 shared slots over 4 experts)."""
    cfg = {
        **STEP_CONFIG,
        "moe_num_experts": 4,
        "share_expert_dim": 2 * STEP_CONFIG["moe_intermediate_size"],
        "swiglu_limits_shared": STEP_CONFIG["swiglu_limits"],
    }
    path, _ = write_checkpoint(tmp_path, cfg)
    index = min(moe_layers(cfg))
    groups = (RankGroup(0, 1), ep_group(0, 2, True), ep_group(1, 2, True))
    layers = [build(str(path), g).model.layers[index].to(DEVICE) for g in groups]
    for layer in layers:
        layer.moe.gate.kernel = layer.moe.kernels = True
    assert [FusedShared.of(m.share_expert, m.moe).count for m in layers] == [2, 1, 1]
    x = torch.randn(
        5, cfg["hidden_size"], device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(5)
    )
    expected = layers[0].moe(x, layers[0].share_expert)
    refuse_eager_routing(monkeypatch, len(x))
    parts = [layer.moe(x, layer.share_expert) for layer in layers[1:]]
    torch.testing.assert_close(sum(parts), expected, rtol=1e-5, atol=1e-5)


def test_unadapted_expert_lists_are_refused(deepseek):
    """A family that hands every expert's module to RoutedExperts under expert parallelism is refused by name
    (layers/moe.py expert_modules builds this rank's)."""
    from outpace.layers.moe import ExpertActivation, RoutedExperts

    with building_in(ep_group(0, 2, True)), pytest.raises(ValueError, match="expert_modules"):
        RoutedExperts(ExpertActivation("silu"), [torch.nn.Linear(2, 2) for _ in range(4)])
    raw = json.loads((Path(deepseek) / "config.json").read_text())
    with (
        building_in(ep_group(0, 5, False)),
        pytest.raises(ShardingError, match="expert_parallel_size=5"),
    ):
        build_model(ModelConfig.from_dict(raw), torch.float32)


def test_dispatch_bytes_at_the_deepseek_v3_shape():
    """distributed/dispatch_bytes.py's table: one row's all-reduce is 2 x 7/8 x 7168 x 2 B a layer (58 layers);
    an all-to-all sends it to 7 x (1 - (7/8)^8) other ranks and back."""
    from outpace.distributed.dispatch_bytes import (
        DEEPSEEK_V3,
        all_reduce_bytes,
        all_to_all_bytes,
        other_ranks_per_row,
    )

    assert all_reduce_bytes(DEEPSEEK_V3, 1, 8) == 2 * 7 / 8 * 7168 * 2 * 58
    assert other_ranks_per_row(8, 8) == pytest.approx(4.595, abs=1e-3)
    assert round(all_to_all_bytes(DEEPSEEK_V3, 1, 8) / 1e6, 2) == 7.64
    assert all_to_all_bytes(DEEPSEEK_V3, 8, 8) == all_to_all_bytes(DEEPSEEK_V3, 1, 8)
    assert round(all_reduce_bytes(DEEPSEEK_V3, 32, 8) / 1e6, 2) == 46.56
