"""``outpace bench multi``'s issue 46 parts on CPU processes (gloo, TP = 2) with tiny shapes: ``item1`` (the
decode step's graph replays counted per engine step, every rank's memory sizing, the hybrid targets against
TP = 1 and their drafters lossless) and ``qwen3next80b`` (a Qwen3-Next shape with its MTP layer, shrunk by
family_shapes.shrink, built with ``load_format="dummy"`` at TP = 2: decode rows against the floor, all-reduces,
labelled oracle rows); and the checks' ability to fail: a step with no captured bucket counts as eager, an NCCL
kernel launched outside a graph launch is reported."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from outpace import LLM
from outpace.bench.family_shapes import QWEN3_NEXT_80B, family_shapes, shrink, with_mtp
from outpace.bench.gpu import engine_8b
from outpace.bench.multi_gpu import forget_timings, run_multi_gpu_bench
from outpace.bench.multi_gpu_measures import decode_replays, kernels_by_launch
from outpace.bench.multi_gpu_plan import Plan
from outpace.bench.oracle import ORACLE_LABEL

TINY = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
QWEN3_NEXT_TINY = shrink(QWEN3_NEXT_80B, 4)  # 3 DeltaNet + 1 gated attention layer, 16 experts of 4
# ep's shapes: 1 dense + 1 MoE layer of DeepSeek-V3, 3 dense + 1 MoE layer of Step-3.5-Flash (16 experts)
EP_TINY = {
    "deepseek-v3-slice": shrink(family_shapes()["deepseek-v3-slice"].config, 2),
    "step-3.5-flash-slice": shrink(family_shapes()["step-3.5-flash-slice"].config, 4),
}
BATCHES, STEPS = (1, 2), 3


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("issue46")
    plan = Plan(
        device="cpu",
        shapes={"8b": TINY},
        zoo_targets=(),
        hybrid_family_drafters=(("tinyqwen35", "eagle3", "tinyqwen35-eagle3", 2),),
        hybrid_random=with_mtp(QWEN3_NEXT_TINY),
        hybrid_dtypes=("float32",),
        seed_model=QWEN3_NEXT_TINY,
        ep_models=EP_TINY,
        prompts=2,
        tokens=6,
        batches=BATCHES,
        context=16,
        decode_steps=STEPS,
        graph_steps=STEPS,
        oracle_steps=2,
        time_limit_s=900,
    )
    run_multi_gpu_bench(root / "out", "item1,qwen3next80b,ep", plan, root / "work")
    return json.loads((root / "out" / "multi_gpu.json").read_text())


def test_every_part_ran(run):
    assert run["errors"] == {} and run["not_run"] == [], (run["errors"], run["not_run"])
    assert run["parts"] == ["item1", "qwen3next80b", "ep"]


def test_one_graph_replay_per_decode_step(run):
    graphs = {(g["tp"], g["batch"]): g for g in run["item1"]["graphs"]}
    assert set(graphs) == {(tp, b) for tp in (1, 2) for b in BATCHES}
    for (_, batch), g in graphs.items():
        assert g["bucket"] == batch and g["decode_steps"] == STEPS
        assert g["replays_by_bucket"] == {str(batch): STEPS}, g
        assert g["eager_steps"] == 0 and g["one_replay_per_step"] and g["tokens_per_s"] > 0
    assert run["item1"]["nccl"] == []  # (profiled on GPUs only)
    verdict = run["targets"]["item1 one graph replay of its bucket per decode step, TP = 2"]
    assert verdict["met"] is True


def test_memory_sizing_per_rank(run):
    memory = {m["tp"]: m["ranks"] for m in run["item1"]["memory"]}
    assert [r["rank"] for r in memory[1]] == [0] and [r["rank"] for r in memory[2]] == [0, 1]
    for ranks in memory.values():
        for r in ranks:
            plan = r["memory_plan"]  # sized from memory: the plan that chose the blocks
            assert plan is not None and plan["num_blocks"] == r["kv_blocks"] > 0
            assert plan["block_bytes"] > 0 and r["weight_bytes"] > 0
    # each rank of TP = 2 holds about half the weights and half the KV heads of TP = 1's one rank
    one, (r0, r1) = memory[1][0], memory[2]
    assert r0["weight_bytes"] == r1["weight_bytes"] < 0.6 * one["weight_bytes"]
    # the ranks agreed on one count, the smallest any rank's memory held
    assert (
        r0["kv_blocks"]
        == r1["kv_blocks"]
        == min(r0["blocks_fitting_this_rank"], r1["blocks_fitting_this_rank"])
    )
    assert r0["memory_plan"]["block_bytes"] < 0.6 * one["memory_plan"]["block_bytes"]


def test_hybrids_at_tp2(run):
    item1 = run["item1"]
    rows = {(r["model"], r["dtype"]): r for r in item1["tp_equality"]}
    assert set(rows) == {("tinyqwen35", "float32"), ("random-qwen3-next", "float32")}
    assert all(r["equal"] and r["match_rate"] == 1.0 for r in rows.values())
    lossless = {(r["target"], r["drafter"]): r for r in item1["lossless"]}
    assert set(lossless) == {("tinyqwen35", "eagle3"), ("random-qwen3-next", "mtp")}
    assert all(r["equal"] for r in lossless.values())
    assert lossless["tinyqwen35", "eagle3"]["tau"] > 1.0  # a trained draft accepts
    assert item1["all_tp_equal_fp32"] is True and item1["all_lossless_fp32"] is True
    assert run["plan"]["hybrid_random"]["num_nextn_predict_layers"] == 1  # drafted by its MTP layer


def test_qwen3_next_at_tp2_with_dummy_weights(run):
    seed = run["qwen3next80b"]
    assert "160 GB" in seed["weights"] and seed["tp"] == 2
    layers = QWEN3_NEXT_TINY["num_hidden_layers"]
    reduces = {r["batch"]: r for r in seed["all_reduce"]}
    assert set(reduces) == set(BATCHES)
    assert all(r["all_reduces"] == 2 * layers and r["seconds"] > 0 for r in reduces.values())
    engines = {e["engine"]: e for e in seed["engines"]}
    assert set(engines) == {"plain", "mtp"}
    for e in engines.values():
        assert [r["rank"] for r in e["ranks"]] == [0, 1] and e["build_s"] > 0
    # the MTP engine holds the MTP layer too (its own MoE)
    assert engines["mtp"]["ranks"][0]["weight_bytes"] > engines["plain"]["ranks"][0]["weight_bytes"]
    decode = {r["batch"]: r for r in seed["decode"]}
    assert set(decode) == set(BATCHES)
    for batch, r in decode.items():
        assert r["tokens_per_s"] > 0 and r["floor_bytes_per_gpu"] > 0
        assert r["all_reduce_seconds"] == reduces[batch]["seconds"]
        assert r["read_seconds"] == pytest.approx(
            r["floor_bytes_per_gpu"] / run["copy_bandwidth_bytes_per_s"]
        )
        assert r["floor_tokens_per_s"] == pytest.approx(
            batch / (r["read_seconds"] + r["all_reduce_seconds"])
        )
    # more tokens choose more distinct experts: the batch-2 floor reads more expert bytes
    assert decode[2]["expected_distinct_experts"] > decode[1]["expected_distinct_experts"]
    assert decode[2]["floor_bytes_per_gpu"] > decode[1]["floor_bytes_per_gpu"]
    oracle = seed["oracle"]
    assert {r["batch"] for r in oracle} == set(BATCHES)
    for r in oracle:
        assert r["label"] == ORACLE_LABEL and r["method"] == "mtp"
        assert {int(k) for k in r["step_ms"]} == {0, 1, 2} and r["tokens_per_s"] > 0
    assert "qwen3next80b TP = 2 MTP batch 1 ORACLE speedups" in run["targets"]


@pytest.mark.parametrize("name", EP_TINY)
def test_expert_parallel_shapes(run, name):
    """Issue 46 item 2 on CPU ranks: EP = TP = 2, each rank floored on its half of the distinct experts, the
    collectives of a step measured, the MoE MTP layer under ORACLE acceptance."""
    shape = run["ep"]["shapes"][name]
    assert shape["ep"] == shape["tp"] == 2
    engines = {e["engine"]: e for e in shape["engines"]}
    assert set(engines) == {"plain", "mtp"}
    assert all([r["rank"] for r in e["ranks"]] == [0, 1] for e in engines.values())
    # the MTP engine holds the MTP layer too (its own MoE)
    assert engines["mtp"]["ranks"][0]["weight_bytes"] > engines["plain"]["ranks"][0]["weight_bytes"]
    layers = EP_TINY[name]["num_hidden_layers"]
    reduces = {r["batch"]: r for r in shape["all_reduce"]}
    assert set(reduces) == set(BATCHES)
    assert all(r["all_reduces"] == 2 * layers for r in reduces.values())
    decode = {r["batch"]: r for r in shape["decode"]}
    assert set(decode) == set(BATCHES)
    for batch, r in decode.items():
        assert r["ep"] == 2 and r["tokens_per_s"] > 0 and r["shape"] == name
        assert r["all_reduce_seconds"] == reduces[batch]["seconds"]
        assert r["floor_tokens_per_s"] == pytest.approx(
            batch / (r["read_seconds"] + r["all_reduce_seconds"])
        )
    assert {r["batch"] for r in shape["oracle"]} == set(BATCHES)
    assert all(r["label"] == ORACLE_LABEL and r["method"] == "mtp" for r in shape["oracle"])
    assert f"ep {name} EP = TP = 2 batch 1 of floor >= 0.75" in run["targets"]


def test_a_rank_reads_its_share_of_the_distinct_experts():
    """StepBudget.expert_ranks: at EP = 2 a step's floor holds half the expert bytes of EP = 1's."""
    from outpace.bench.families import StepBudget, step_bytes

    one = StepBudget(10, 0, 100, 2, 16, 4, (), 0)
    two = StepBudget(10, 0, 100, 2, 16, 4, (), 0, expert_ranks=2)
    assert step_bytes(one, 8, 0) - 10 == pytest.approx(2 * (step_bytes(two, 8, 0) - 10))


def test_a_step_without_its_graph_counts_as_eager(tmp_path):
    """Only bucket 1 captured: batch 2 runs every step eagerly, and the row says so."""
    model, kwargs = engine_8b(
        tmp_path / "tiny", None, 16, 2, config=TINY, device="cpu", cuda_graph_sizes=(1,)
    )
    with LLM(model, **kwargs) as llm:
        llm.engine.capture_graphs()  # (at start-up on a GPU; the replays run eagerly on the CPU)
        row = decode_replays(llm, 2, 16, STEPS)
        assert row["bucket"] is None and row["eager_steps"] == STEPS
        assert not row["one_replay_per_step"] and row["replays_by_bucket"] == {}
        assert decode_replays(llm, 1, 16, STEPS)["one_replay_per_step"]


def test_nccl_kernels_by_their_launch():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(i, name, device):
        return SimpleNamespace(id=i, name=name, device_type=device)

    inside = [event(1, "cudaGraphLaunch", cpu), event(1, "ncclDevKernel_AllReduce", cuda)]
    outside = [event(2, "cudaLaunchKernelExC", cpu), event(2, "ncclDevKernel_AllReduce", cuda)]
    other = [event(3, "cudaLaunchKernel", cpu), event(3, "gemm", cuda)]
    got = kernels_by_launch(inside + other, "nccl")
    assert got["all_in_graphs"] is True and got["outside_graphs"] == 0 and got["count"] == 1
    got = kernels_by_launch(inside + outside + other, "nccl")
    assert got["all_in_graphs"] is False and got["outside_graphs"] == 1
    assert got["by_launch"] == {"cudaGraphLaunch": 1, "cudaLaunchKernelExC": 1}
    unmatched = kernels_by_launch([event(4, "ncclDevKernel_AllReduce", cuda)], "nccl")
    assert unmatched["all_in_graphs"] is None  # nothing to judge by


@pytest.mark.gpu  # a CUDA graph and the CUDA profiler
def test_profiled_kernels_are_matched_to_their_graph_launch():
    """On the GPU, the premise of ``nccl_launches``: a kernel replayed from a CUDA graph is matched to the
    graph launch, one launched eagerly to its own launch call."""
    from torch.profiler import ProfilerActivity, profile

    from outpace.engine.cuda_graphs import CapturedCall

    x = torch.zeros(1 << 20, device="cuda")
    captured = CapturedCall(lambda: x.mul_(2.0), torch.device("cuda"))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            captured.replay()
            x.add_(1.0)  # eager
        torch.cuda.synchronize()
    got = kernels_by_launch(prof.events(), "elementwise")
    in_graphs = sum(n for name, n in got["by_launch"].items() if "GraphLaunch" in name)
    assert in_graphs == 3 and got["outside_graphs"] == 3 and got["graph_launches"] == 3, got
    assert captured.replays == 3  # (the capture's own warm-up call is not one)


def test_defaults_and_another_gpu():
    plan = Plan()
    assert plan.seed_model["num_hidden_layers"] == 48 and "num_nextn_predict_layers" not in (
        plan.seed_model
    )
    assert plan.hybrid_random["num_hidden_layers"] == 4
    assert plan.hybrid_random["num_experts"] == 512  # the real widths, a layer slice
    result = {
        "item1": {"graphs": [1], "nccl": [], "memory": [2], "tp_equality": [3], "lossless": []},
        "qwen3next80b": {"decode": [1]},
        "done": [
            "item1: graphs and memory 8b TP = 2",
            "item1: tinyqwen35 float32",
            "qwen3next80b: all-reduces",
        ],
        "seconds": {},
    }
    forget_timings(result, "measured on H100")
    assert "qwen3next80b" not in result and result["done"] == ["item1: tinyqwen35 float32"]
    assert result["item1"] == {
        "graphs": [],
        "nccl": [],
        "memory": [],
        "tp_equality": [3],
        "lossless": [],
    }
