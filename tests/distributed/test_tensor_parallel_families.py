"""Tensor parallelism beyond the Llama family, on CPU processes (gloo), in fp32: DeepSeek-V2/V3 (MLA heads
split, the latent cache whole on every rank, every expert's rows split, shared experts too), Qwen3-MoE (heads
and every expert's rows split, a dense layer between; Qwen3-VL-MoE's stacked experts stored transposed;
Qwen2-MoE's gated shared expert; Mixtral's experts under the hub's names), Mistral 4 (MLA, stacked experts) and Gemma 3 (heads split, a kv head replicated, the
embedding replicated as Gemma keeps it) give exactly the TP = 1
greedy tokens at TP = 2 and TP = 3 with batching, chunked prefill and preemption; an EAGLE3 draft that
borrows a Gemma target's replicated embedding and tied head is handed this rank's vocabulary shard of it
and stays lossless at TP = 2; dimensions that do not split are refused by name.

One group of 2 and one of 3 processes (tests/helpers/tp_harness.py) run every scenario; the TP = 1 references
run in the test process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.deepseek_models import make_hf_deepseek, make_hf_mistral4
from helpers.gemma_models import PROMPT, SPLITTABLE, make_splittable_gemma
from helpers.hf_models import make_hf_model, save_hf_model
from helpers.qwen3_moe_models import make_qwen3_moe, make_qwen3_vl_moe, to_hub_expert_order
from helpers.spec_models import make_eagle3_draft
from helpers.tp_harness import Scenario, build_rank, run_group
from outpace import LLM, SamplingParams
from outpace.checkpoint import load_checkpoint
from outpace.config import SpeculativeConfig
from outpace.distributed.group import RankGroup, building_in
from outpace.distributed.sharding import ShardingError
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
# a small pool and token budget: several requests batched, prompts chunked, requests preempted
PRESSURE = dict(block_size=4, num_kv_blocks=24, max_num_batched_tokens=16)
# 6 heads, every MLP (dense 96, experts 24, shared 24 or 48) divisible by 2 and by 3
DEEPSEEK = dict(num_attention_heads=6, num_key_value_heads=6, intermediate_size=96)
DEEPSEEKS = [
    "v3-yarn",
    "v2-group",
]  # q_lora_rank, grouped sigmoid routing; biases on attention, MLPs, shared experts


# 6 heads and kv heads, dense MLP 96 and experts 24 wide: all divisible by 2 and by 3; 211 tokens
QWEN3_MOE = dict(
    vocab_size=211, num_attention_heads=6, num_key_value_heads=6, intermediate_size=96,
    moe_intermediate_size=24,
)  # fmt: skip


# 6 heads and kv heads, MLPs 96 (dense), 24 (experts) and 48 (shared): all divisible by 2 and by 3
QWEN2_MOE = dict(
    num_attention_heads=6, num_key_value_heads=6, moe_intermediate_size=24,
    shared_expert_intermediate_size=48,
)  # fmt: skip


def family_prompts() -> list[list[int]]:
    return [[(i * 37 + j * 11) % 199 + 1 for j in range(3 + 9 * i)] for i in range(5)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("families")
    paths = {v: str(save_hf_model(make_hf_deepseek(v, **DEEPSEEK), root / v)) for v in DEEPSEEKS}
    paths.update({v: str(save_hf_model(make_splittable_gemma(v), root / v)) for v in SPLITTABLE})
    moe = make_qwen3_moe("renormalised", **QWEN3_MOE)
    paths["qwen3-moe"] = str(save_hf_model(moe, root / "qwen3-moe"))
    # Qwen3-VL-MoE's text model, its expert stacks in the hub's order (read swapped, this rank's rows)
    vl = save_hf_model(make_qwen3_vl_moe(**QWEN3_MOE), root / "qwen3-vl-moe")
    paths["qwen3-vl-moe"] = str(to_hub_expert_order(vl))
    # Qwen2-MoE: the gated shared expert's rows split too, its gate whole
    qwen2_moe = make_hf_model("qwen2-moe", **QWEN2_MOE)
    paths["qwen2-moe"] = str(save_hf_model(qwen2_moe, root / "qwen2-moe"))
    # Mixtral: every expert's rows split, in the hub's names (block_sparse_moe.experts.{e}.w1/w3/w2)
    mixtral = make_hf_model(
        "mixtral", num_attention_heads=6, num_key_value_heads=6, intermediate_size=24
    )
    paths["mixtral"] = str(save_hf_model(mixtral, root / "mixtral"))
    # Mistral 4: MLA's heads split, its stacked experts' rows split (layers/moe.py stacked_experts)
    paths["mistral4"] = str(save_hf_model(make_hf_mistral4(**DEEPSEEK), root / "mistral4"))
    return paths


@pytest.fixture(scope="module")
def gemma_draft(checkpoints, tmp_path_factory) -> str:
    """An EAGLE3 draft for the Gemma 3 target with neither embedding nor head: it borrows the target's
    (replicated) embedding and its head tied to it."""
    out = tmp_path_factory.mktemp("gemma-draft")
    make_eagle3_draft(
        Path(checkpoints["gemma3"]),
        out,
        aux_ids=[1, 2, 4],
        use_aux_norm=True,
        target_model_type="gemma3_text",
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=96,
        seed=5,
    )  # (seed 5: some of its tree's drafts are accepted)
    tensors = load_file(out / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, out / "model.safetensors")
    return str(out)


def gemma_spec(draft: str) -> SpeculativeConfig:
    return SpeculativeConfig("eagle3", draft, num_steps=3, topk=2, num_draft_tokens=6)


class DraftReads:
    """A probe (tests/helpers/tp_harness.py) run on every rank: the Gemma target and its EAGLE3 draft built in the
    group, and what the draft reads from the borrowed embedding and computes with the borrowed head."""

    __name__ = "draft_reads"

    def __init__(self, target: str, draft: str) -> None:
        self.target, self.draft = target, draft

    def __call__(self, rank: int, world: int) -> dict:
        import torch.distributed as dist

        group = RankGroup(rank, world, dist.group.WORLD, dist.group.WORLD)
        return draft_reads(self.target, self.draft, group)


def draft_reads(target_dir: str, draft_dir: str, group: RankGroup) -> dict:
    from outpace.models.drafts.eagle3 import load_eagle3_draft

    with building_in(group):
        target = build_model(ModelConfig.from_pretrained(target_dir), torch.float32)
        load_checkpoint(target, target_dir, progress=False)
        draft = load_eagle3_draft(draft_dir, target, torch.float32, "cpu")
    ids = torch.arange(0, 211, 5)  # ids of both ranks' rows
    hidden = torch.randn(ids.numel(), 60, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return {
            "embedding": draft.embed(ids).tolist(),
            "logits": draft.compute_logits(hidden).tolist(),
        }


def scenarios(checkpoints, gemma_draft=None) -> list[Scenario]:
    out = [
        Scenario(name, path, family_prompts(), GREEDY, PRESSURE)
        for name, path in checkpoints.items()
    ]
    if gemma_draft is not None:
        out.append(
            Scenario(
                "gemma3-eagle3",
                checkpoints["gemma3"],
                [PROMPT, PROMPT[3:] + PROMPT[:5]],
                GREEDY.replace(max_tokens=32),
                dict(
                    block_size=4,
                    num_kv_blocks=64,
                    max_num_batched_tokens=10,
                    speculative=gemma_spec(gemma_draft),
                ),
            )
        )
    return out


@pytest.fixture(scope="module")
def tp2(checkpoints, gemma_draft, tmp_path_factory) -> dict:
    return run_group(
        2,
        scenarios(checkpoints, gemma_draft),
        tmp_path_factory.mktemp("tp2"),
        probes=[DraftReads(checkpoints["gemma3"], gemma_draft)],
    )


@pytest.fixture(scope="module")
def tp3(checkpoints, tmp_path_factory) -> dict:
    return run_group(3, scenarios(checkpoints), tmp_path_factory.mktemp("tp3"))


def reference(model: str, prompts, params=GREEDY, **engine) -> list[list[int]]:
    with LLM(model, **engine) as llm:
        return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize(
    "variant",
    DEEPSEEKS
    + list(SPLITTABLE)
    + ["qwen3-moe", "qwen3-vl-moe", "qwen2-moe", "mixtral", "mistral4"],
)
@pytest.mark.parametrize("size", [2, 3])
def test_family_matches_one_rank(variant, size, checkpoints, request):
    got = request.getfixturevalue(f"tp{size}")[variant]
    assert got["tokens"] == reference(checkpoints[variant], family_prompts(), **PRESSURE)
    assert got["preemptions"] > 0
    assert got["free_blocks"] == PRESSURE["num_kv_blocks"]


def test_eagle3_on_a_replicated_gemma_embedding_is_lossless(tp2, checkpoints, gemma_draft):
    """The draft borrows the target's whole table and tied head; at two ranks it reads this rank's rows of
    them (vocab-parallel, the last rank padded): greedy tokens equal the target's alone, and the draft's
    drafts are accepted exactly as often as at one rank."""
    got = tp2["gemma3-eagle3"]
    prompts, params = [PROMPT, PROMPT[3:] + PROMPT[:5]], GREEDY.replace(max_tokens=32)
    assert got["tokens"] == reference(checkpoints["gemma3"], prompts, params, block_size=4)
    with LLM(checkpoints["gemma3"], block_size=4, speculative=gemma_spec(gemma_draft)) as llm:
        outs = llm.generate(prompts, params)
    assert got["accepted"] == sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0
    assert got["verifies"] == sum(o.spec_metrics.num_verifies for o in outs)


def test_the_draft_reads_the_same_rows_and_logits_at_two_ranks(tp2, checkpoints, gemma_draft):
    one = draft_reads(checkpoints["gemma3"], gemma_draft, RankGroup(0, 1))
    two = tp2["draft_reads"]
    assert torch.equal(torch.tensor(two["embedding"]), torch.tensor(one["embedding"]))
    torch.testing.assert_close(
        torch.tensor(two["logits"]), torch.tensor(one["logits"]), rtol=1e-6, atol=1e-6
    )


def test_a_replicated_table_is_handed_as_this_ranks_rows(checkpoints, gemma_draft):
    """Gemma's table is whole on every rank; the draft gets ceil-divided rows (a multiple of 64 per rank: 211
    -> 128), rank 0 as views of the target's table, rank 1 its 83 rows then zeros; its borrowed head is
    tied to those rows, not to the whole table."""
    from outpace.models.drafts.eagle3 import load_eagle3_draft

    whole = build_rank(checkpoints["gemma3"], 0, 1).model.embed_tokens.weight
    for rank in range(2):
        target = build_rank(checkpoints["gemma3"], rank, 2)
        assert torch.equal(target.model.embed_tokens.weight, whole)
        with building_in(RankGroup(rank, 2)):
            draft = load_eagle3_draft(gemma_draft, target, torch.float32, "cpu")
        rows, head = draft.embedding.table, draft.head
        assert rows.weight.shape == (128, whole.shape[1]) and rows.first_id == 128 * rank
        assert head.weight is rows.weight and head.group.size == 2
        n = min(128, 211 - 128 * rank)  # rank 0: 128 rows of the table, rank 1: 83 and 45 zero rows
        assert torch.equal(rows.weight[:n], whole[128 * rank : 128 * rank + n])
        assert not rows.weight[n:].any()
        if rank == 0:
            assert rows.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()


def test_expert_shards_cover_the_checkpoint(checkpoints):
    """Every rank holds every expert's rows r * I / size ..: DeepSeek's separate gate/up/down and the shared
    experts, Gemma 4's packed gate/up (this rank's rows of each half); the MLA heads split, the latent
    projection whole on every rank."""
    ds = [build_rank(checkpoints["v3-yarn"], r, 3) for r in range(4)]  # (index 3: the whole model)
    ds[3] = build_rank(checkpoints["v3-yarn"], 0, 1)
    moe = [m.model.layers[1].mlp for m in ds]
    for e in (0, 5):
        assert torch.equal(
            torch.cat([m.experts[e].gate_proj.weight for m in moe[:3]]),
            moe[3].experts[e].gate_proj.weight,
        )
        assert torch.equal(
            torch.cat([m.experts[e].down_proj.weight for m in moe[:3]], 1),
            moe[3].experts[e].down_proj.weight,
        )
    assert torch.equal(
        torch.cat([m.shared_experts.up_proj.weight for m in moe[:3]]),
        moe[3].shared_experts.up_proj.weight,
    )
    attn = [m.model.layers[0].self_attn for m in ds]
    assert torch.equal(torch.cat([a.kv_b_proj.weight for a in attn[:3]]), attn[3].kv_b_proj.weight)
    assert all(
        torch.equal(a.kv_a_proj_with_mqa.weight, attn[3].kv_a_proj_with_mqa.weight) for a in attn
    )
    assert [a.shape.num_heads for a in attn] == [2, 2, 2, 6]

    g4 = [build_rank(checkpoints["gemma4"], r, 2).model.layers[0].experts for r in range(2)]
    whole = build_rank(checkpoints["gemma4"], 0, 1).model.layers[0].experts
    gate, up = whole.gate_up_proj.chunk(2, dim=1)
    halves = [x.gate_up_proj.chunk(2, dim=1) for x in g4]
    assert torch.equal(torch.cat([h[0] for h in halves], 1), gate)
    assert torch.equal(torch.cat([h[1] for h in halves], 1), up)
    assert torch.equal(torch.cat([x.down_proj for x in g4], 2), whole.down_proj)


def test_dimensions_that_do_not_split_are_refused(checkpoints):
    raw = json.loads((Path(checkpoints["v3-yarn"]) / "config.json").read_text())
    with building_in(RankGroup(0, 4)), pytest.raises(ShardingError, match="num_attention_heads=6"):
        build_model(ModelConfig.from_pretrained(checkpoints["v3-yarn"]), torch.float32)
    with (
        building_in(RankGroup(0, 2)),
        pytest.raises(ShardingError, match="moe_intermediate_size=25"),
    ):
        build_model(ModelConfig.from_dict({**raw, "moe_intermediate_size": 25}), torch.float32)
    raw = json.loads((Path(checkpoints["gemma4"]) / "config.json").read_text())
    with building_in(RankGroup(0, 4)), pytest.raises(ShardingError, match="num_attention_heads=6"):
        build_model(ModelConfig.from_dict(raw), torch.float32)
