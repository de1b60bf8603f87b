"""Tensor parallelism for the hybrid targets, on CPU processes (gloo), in fp32: Qwen3-Next (gated DeltaNet
packed by key head, MoE with a shared expert), Qwen3.5 (separate q/k/v, z, b, a projections) and Nemotron-H
(Mamba2 with two groups, and with one group replicated on both ranks; MoE, also latent, ungated MLP, attention
without RoPE) give exactly the TP = 1 greedy tokens at TP = 2 with batching, chunked prefill and preemption. With
speculation (EAGLE3 chain and tree; the checkpoints' own MTP layers, one reused, two chained, Nemotron-H's
attention-and-experts stack; DFlash; the target as its own standalone draft, whose sharded state rows roll back
as the target's) the tokens equal the target's alone and as many drafts are accepted as at one rank. Each rank's recurrent state
indices hold its heads' state; its shards put back together are the checkpoint.

One group of 2 processes (tests/helpers/tp_harness.py) runs every scenario; the TP = 1 references run in the test
process.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from helpers.hybrid_drafting import MTP_LAYERS, PROMPTS, VOCAB, save_with_mtp
from helpers.hybrid_models import make_hybrid, save_hybrid
from helpers.spec_models import make_dflash_draft, make_eagle3_draft
from helpers.tp_harness import Scenario, build_rank, run_group
from outpace import LLM, SamplingParams
from outpace.cache.recurrent_states import RecurrentStates
from outpace.config import SpeculativeConfig
from outpace.distributed.group import RankGroup, building_in
from outpace.distributed.sharding import ShardingError
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
# a small pool and token budget: several requests batched, prompts chunked, requests preempted
PRESSURE = dict(block_size=4, num_kv_blocks=12, max_num_batched_tokens=8)
SPEC_ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8)
# one layer (Nemotron-H: one MTP stack) reused over three steps; two layers chained
MTP_STEPS = {"qwen3_next": 3, "qwen3_5": 2, "nemotron_h": 3}
PLAIN = {
    "qwen3_next": {},
    "qwen3_5": {},
    "nemotron_h": {},
    "nemotron_h-1group": {"n_groups": 1},
    # the experts' sums all-reduced in the latent space; larger weights, so that the routed sum through
    # fc1/fc2_latent_proj moves the tokens (at the default scale, half of it left out on each rank went unseen)
    "nemotron_h-latent": {"moe_latent_size": 8, "weight_scale": 12.0},
}


def plain_prompts() -> list[list[int]]:
    return [[(i * 37 + j * 11) % 129 + 1 for j in range(3 + 7 * i)] for i in range(4)]


def drafters(target: Path, root: Path) -> dict[str, SpeculativeConfig]:
    """EAGLE3 chain and tree, the target as its own standalone draft, and DFlash over every layer's features."""
    eagle3 = str(make_eagle3_draft(target, root / "eagle3"))
    layers = ModelConfig.from_pretrained(
        str(target)
    ).num_hidden_layers  # (Nemotron-H's config.json names none)
    dflash = make_dflash_draft(
        target,
        root / "dflash",
        layer_ids=tuple(range(layers)),
        mask_token_id=VOCAB - 1,
        num_target_layers=layers,
    )
    return {
        "eagle3-chain": SpeculativeConfig("eagle3", eagle3, num_steps=3),
        "eagle3-tree": SpeculativeConfig("eagle3", eagle3, num_steps=3, topk=2, num_draft_tokens=6),
        "draft": SpeculativeConfig("draft", str(target), num_steps=3),
        "dflash": SpeculativeConfig("dflash", str(dflash), num_steps=3),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """name -> (checkpoint directory, engine settings, prompts): the plain targets, and every speculative
    scenario (a target of VOCAB tokens, so random drafts are accepted now and then)."""
    root = tmp_path_factory.mktemp("hybrids")
    out = {}
    for name, overrides in PLAIN.items():
        path = str(save_hybrid(make_hybrid(name.split("-")[0], **overrides), root / name))
        out[name] = (path, PRESSURE, plain_prompts())
    for variant in ("qwen3_next", "qwen3_5", "nemotron_h"):
        if variant in MTP_LAYERS:
            path = save_with_mtp(variant, root / f"{variant}-mtp", MTP_LAYERS[variant])[1]
            mtp = SpeculativeConfig("mtp", num_steps=MTP_STEPS[variant])
            out[f"{variant}-mtp"] = (str(path), dict(SPEC_ENGINE, speculative=mtp), PROMPTS)
        else:
            path = save_hybrid(make_hybrid(variant, vocab_size=VOCAB), root / f"{variant}-spec")
        for method, spec in drafters(Path(path), root / f"{variant}-drafts").items():
            out[f"{variant}-{method}"] = (str(path), dict(SPEC_ENGINE, speculative=spec), PROMPTS)
    return out


@pytest.fixture(scope="module")
def tp2(checkpoints, tmp_path_factory) -> dict:
    scenarios = [
        Scenario(name, path, prompts, GREEDY, engine)
        for name, (path, engine, prompts) in checkpoints.items()
    ]
    return run_group(2, scenarios, tmp_path_factory.mktemp("tp2"), timeout_s=900)


@functools.cache
def one_rank(path: str, spec: SpeculativeConfig | None, plain: bool) -> tuple[list[list[int]], int]:
    """TP = 1: the greedy tokens and the drafts accepted, under PRESSURE over plain_prompts() (``plain``) or
    under SPEC_ENGINE over PROMPTS; once per (target, drafter): a target's speculative scenarios share its
    plain reference."""
    engine = dict(PRESSURE) if plain else dict(SPEC_ENGINE)
    if spec is not None:
        engine["speculative"] = spec
    with LLM(path, **engine) as llm:
        outs = llm.generate(plain_prompts() if plain else PROMPTS, GREEDY)
    return [o.token_ids for o in outs], sum(o.spec_metrics.num_accepted_drafts for o in outs)


@pytest.mark.parametrize("name", list(PLAIN))
def test_greedy_at_two_ranks_matches_one(name, tp2, checkpoints):
    path = checkpoints[name][0]
    got = tp2[name]
    assert got["tokens"] == one_rank(path, None, True)[0]
    assert got["preemptions"] > 0, "the pool was meant to force preemption"
    assert got["free_blocks"] == PRESSURE["num_kv_blocks"]


@pytest.mark.parametrize(
    "name",
    ["qwen3_next-mtp", "qwen3_5-mtp", "nemotron_h-mtp"]
    + [
        f"{v}-{m}"
        for v in ("qwen3_next", "qwen3_5", "nemotron_h")
        for m in ("eagle3-chain", "eagle3-tree", "draft", "dflash")
    ],
)
def test_speculation_at_two_ranks_is_lossless_with_one_ranks_acceptance(name, tp2, checkpoints):
    path, engine, _ = checkpoints[name]
    got = tp2[name]
    assert got["tokens"] == one_rank(path, None, False)[0]
    assert got["accepted"] == one_rank(path, engine["speculative"], False)[1] > 0
    assert got["free_blocks"] == engine["num_kv_blocks"]
    if name.endswith(
        "-draft"
    ):  # the target as its own draft (its own state rows): every draft accepted
        assert got["accepted"] >= 0.9 * 3 * got["verifies"]


def test_gated_deltanet_shards_cover_the_checkpoint(checkpoints):
    """Qwen3.5: rank r holds key heads r of 2 with value heads 2r, 2r + 1 (4 of 2 key heads' groups): its q, k,
    v rows of in_proj_qkv and of the convolution, its z/b/a rows, A_log and dt_bias, out_proj's columns; the
    state rows hold its heads' state only."""
    path = checkpoints["qwen3_5"][0]
    whole = build_rank(path, 0, 1).model.layers[0].linear_attn
    ranks = [build_rank(path, r, 2).model.layers[0].linear_attn for r in range(2)]
    kd, vd = 8, 4 * 6  # 2 key heads of 8 dims, 4 value heads of 6
    for name in ("in_proj_qkv", "conv1d"):
        full = getattr(whole, name).weight.split([2 * 8, 2 * 8, vd])
        mine = [getattr(a, name).weight.split([8, 8, vd // 2]) for a in ranks]
        for p in range(3):
            assert torch.equal(torch.cat([m[p] for m in mine]), full[p])
    for name in ("in_proj_z", "in_proj_b", "in_proj_a"):
        assert torch.equal(
            torch.cat([getattr(a, name).weight for a in ranks]), getattr(whole, name).weight
        )
    for name in ("A_log", "dt_bias"):
        assert torch.equal(torch.cat([getattr(a, name) for a in ranks]), getattr(whole, name))
    assert torch.equal(torch.cat([a.out_proj.weight for a in ranks], 1), whole.out_proj.weight)
    assert all(torch.equal(a.norm.weight, whole.norm.weight) for a in ranks)
    assert ranks[0].state_shapes()["recurrent"][0] == (2, kd, 6)
    assert ranks[0].state_shapes()["conv"][0] == (3, 2 * 8 + vd // 2)
    half, full = (
        RecurrentStates(
            build_rank(path, 0, size).model, 3, 4, torch.float32, "cpu"
        ).bytes_per_request
        for size in (2, 1)
    )
    assert 2 * half == full  # (every recurrent state tensor split by heads)


def test_qwen3_next_packed_by_key_head_shards(checkpoints):
    """Qwen3-Next's in_proj_qkvz / in_proj_ba are grouped by key head: rank r's rows are key head r's group."""
    path = checkpoints["qwen3_next"][0]
    whole = build_rank(path, 0, 1).model.layers[0].linear_attn
    ranks = [build_rank(path, r, 2).model.layers[0].linear_attn for r in range(2)]
    for name in ("in_proj_qkvz", "in_proj_ba"):
        assert torch.equal(
            torch.cat([getattr(a, name).weight for a in ranks]), getattr(whole, name).weight
        )
    assert [a.num_k_heads for a in ranks] == [1, 1] and [a.num_v_heads for a in ranks] == [2, 2]


@pytest.mark.parametrize("name", ["nemotron_h", "nemotron_h-1group"])
def test_mamba2_shards_cover_the_checkpoint(name, checkpoints):
    """6 heads of 5 dims split 3 + 3; with 2 groups (of 7 state dims) one each, with 1 group it is whole on both
    ranks (its B and C rows replicated); in_proj's z, x, B, C, dt and the convolution's x, B, C sliced per part."""
    path = checkpoints[name][0]
    split = name == "nemotron_h"  # else one group, whole on both ranks
    g = (2 if split else 1) * 7
    whole = build_rank(path, 0, 1).model.layers[0].mixer
    ranks = [build_rank(path, r, 2).model.layers[0].mixer for r in range(2)]

    def covers(full: torch.Tensor, mine: list[torch.Tensor], heads: bool) -> bool:
        return (
            torch.equal(torch.cat(mine), full)
            if heads or split
            else all(torch.equal(m, full) for m in mine)
        )

    for tensor, sizes, mine_sizes, of_heads in [
        (
            lambda m: m.in_proj.weight,
            [30, 30, g, g, 6],
            [15, 15, 7, 7, 3],
            [True, True, False, False, True],
        ),
        (lambda m: m.conv1d.weight, [30, g, g], [15, 7, 7], [True, False, False]),
        (lambda m: m.conv1d.bias, [30, g, g], [15, 7, 7], [True, False, False]),
    ]:
        full, mine = tensor(whole).split(sizes), [tensor(m).split(mine_sizes) for m in ranks]
        for p, heads in enumerate(of_heads):
            assert covers(full[p], [m[p] for m in mine], heads), (sizes, p)
    for name_ in ("A_log", "dt_bias", "D"):
        assert torch.equal(torch.cat([getattr(m, name_) for m in ranks]), getattr(whole, name_))
    assert torch.equal(torch.cat([m.norm.weight for m in ranks]), whole.norm.weight)
    assert ranks[1].state_shapes()["ssm"][0] == (3, 5, 7)
    assert ranks[1].state_shapes()["conv"][0] == (3, 15 + 2 * 7)


def test_what_does_not_split_is_refused_by_name(checkpoints):
    for name, size, field in [
        ("qwen3_5", 4, "linear_num_key_heads=2"),
        ("nemotron_h", 4, "mamba_num_heads=6"),
        ("nemotron_h", 3, "n_groups=2"),
    ]:
        with building_in(RankGroup(0, size)), pytest.raises(ShardingError, match=field):
            build_model(ModelConfig.from_pretrained(checkpoints[name][0]), torch.float32)
