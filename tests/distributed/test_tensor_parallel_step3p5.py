"""Tensor parallelism for Step-3.5 (models/step3p5.py) on CPU processes (gloo), in fp32: the tiny Step config of
tests/models/test_step3p5.py (full layers 4 heads / 2 kv heads, sliding layers 6 heads / here 1 kv head, replicated
at two ranks; the per-head sigmoid gate; stacked experts and a shared expert; three MoE-or-dense MTP layers with
their own heads) gives exactly the TP = 1 greedy tokens at TP = 2 with batching, chunked prefill and
preemption, and MTP speculation at TP = 2 gives the TP = 1 plain greedy tokens with the TP = 1 acceptance;
each rank holds its rows of every stacked expert, the gate rows of its heads; head counts and expert widths
that do not split are refused under their config field's name.

One group of 2 processes (tests/helpers/tp_harness.py) runs both scenarios; the TP = 1 references run in this
process."""

from __future__ import annotations

import pytest
import torch

from helpers.step3p5_checkpoints import CONFIG, write_checkpoint
from helpers.tp_harness import Scenario, build_rank, run_group
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.distributed.group import RankGroup, building_in
from outpace.distributed.sharding import ShardingError
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
# a small pool and token budget: several requests batched, prompts chunked, requests preempted
PRESSURE = dict(block_size=4, num_kv_blocks=24, max_num_batched_tokens=16)
MTP_SPEC = dict(block_size=4, speculative=SpeculativeConfig("mtp", num_steps=3))
# a small vocabulary (random MTP layers' drafts are accepted now and then, test_step3p5.py's mtp_target); one kv
# head on the sliding layers, replicated on both ranks
STEP = {
    **CONFIG,
    "vocab_size": 13,
    "attention_other_setting": {**CONFIG["attention_other_setting"], "num_attention_groups": 1},
}
PROMPTS = [[(i * 5 + j * 3) % 13 for j in range(3 + 7 * i)] for i in range(5)]


@pytest.fixture(scope="module")
def step(tmp_path_factory) -> str:
    path, _ = write_checkpoint(tmp_path_factory.mktemp("step3p5-tp"), STEP, seed=4)
    return str(path)


@pytest.fixture(scope="module")
def tp2(step, tmp_path_factory) -> dict:
    return run_group(
        2,
        [
            Scenario("greedy", step, PROMPTS, GREEDY, PRESSURE),
            Scenario("mtp", step, PROMPTS[:3], GREEDY.replace(max_tokens=24), MTP_SPEC),
        ],
        tmp_path_factory.mktemp("tp2"),
    )


def generate(model: str, prompts, params, **engine):
    with LLM(model, **engine) as llm:
        return llm.generate(prompts, params)


def test_greedy_at_two_ranks_matches_one(tp2, step):
    got = tp2["greedy"]
    assert got["tokens"] == [o.token_ids for o in generate(step, PROMPTS, GREEDY, **PRESSURE)]
    assert got["preemptions"] > 0
    assert got["free_blocks"] == PRESSURE["num_kv_blocks"]


def test_mtp_at_two_ranks_is_lossless_with_one_ranks_acceptance(tp2, step):
    params = GREEDY.replace(max_tokens=24)
    got = tp2["mtp"]
    assert got["tokens"] == [o.token_ids for o in generate(step, PROMPTS[:3], params, block_size=4)]
    one = generate(step, PROMPTS[:3], params, **MTP_SPEC)
    assert got["accepted"] == sum(o.spec_metrics.num_accepted_drafts for o in one) > 0
    assert got["verifies"] == sum(o.spec_metrics.num_verifies for o in one)


def test_shards_cover_the_checkpoint(step):
    """Every rank: its half of every expert's gate/up rows and down columns and of the shared expert's, its
    heads' q and gate rows, the sliding layers' one kv head whole, the full layers' own kv head; an MTP
    layer's experts and its own head's vocabulary rows too."""
    ranks, whole = [build_rank(step, r, 2) for r in range(2)], build_rank(step, 0, 1)
    for layer in (
        1,
        "mtp0",
    ):  # a decoder MoE layer (sliding) and the first MTP layer (MoE, sliding)
        parts = [m.mtp_layers[0] if layer == "mtp0" else m.model.layers[layer] for m in ranks]
        ref = whole.mtp_layers[0] if layer == "mtp0" else whole.model.layers[layer]
        for name, dim in (("gate_proj", 1), ("up_proj", 1), ("down_proj", 2)):
            assert torch.equal(
                torch.cat([getattr(p.moe, name).weight for p in parts], dim),
                getattr(ref.moe, name).weight,
            )
        assert torch.equal(
            torch.cat([p.share_expert.up_proj.weight for p in parts]),
            ref.share_expert.up_proj.weight,
        )
        attn = [p.self_attn for p in parts]
        assert torch.equal(torch.cat([a.g_proj.weight for a in attn]), ref.self_attn.g_proj.weight)
        assert torch.equal(torch.cat([a.q_proj.weight for a in attn]), ref.self_attn.q_proj.weight)
        assert all(
            torch.equal(a.k_proj.weight, ref.self_attn.k_proj.weight) for a in attn
        )  # replicated
        assert [a.attn.num_heads for a in attn] == [3, 3]
    full = [m.model.layers[0].self_attn for m in ranks]
    assert torch.equal(
        torch.cat([a.k_proj.weight for a in full]), whole.model.layers[0].self_attn.k_proj.weight
    )
    assert [a.attn.num_heads for a in full] == [2, 2]
    heads = [m.mtp_layers[2].shared_head.head.weight for m in ranks]
    assert (
        torch.equal(heads[0][:13], whole.mtp_layers[2].shared_head.head.weight)
        and not heads[1].any()
    )


def refused(raw: dict, size: int, name: str) -> None:
    with building_in(RankGroup(0, size)), pytest.raises(ShardingError, match=name):
        build_model(ModelConfig.from_dict(raw), torch.float32)


def test_what_does_not_split_is_refused_by_name():
    refused(
        STEP, 3, r"num_attention_heads=4 does not split over tensor_parallel_size=3"
    )  # the full layers
    sliding = {
        **STEP["attention_other_setting"],
        "num_attention_heads": 4,
        "num_attention_groups": 2,
    }
    splits = dict(
        num_attention_heads=6,
        num_attention_groups=3,
        intermediate_size=54,
        moe_intermediate_size=21,
        share_expert_dim=27,
    )  # at three ranks, all but the sliding layers' heads
    refused(
        {**STEP, **splits, "attention_other_setting": sliding},
        3,
        r"attention_other_setting\.num_attention_heads=4 does not split",
    )
    refused({**STEP, "moe_intermediate_size": 21}, 2, "moe_intermediate_size=21")
    refused({**STEP, "share_expert_dim": 27}, 2, "share_expert_dim=27")
    refused({**STEP, "intermediate_size": 55}, 2, "intermediate_size=55")
