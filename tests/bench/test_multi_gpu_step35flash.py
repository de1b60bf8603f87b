"""``outpace bench multi``'s ``step35flash`` part (issue 46 item 3) on CPU processes (gloo, EP = TP = 2): Step-3.5-Flash
shrunk by family_shapes.shrink (3 dense + 1 MoE layer, 16 experts) in block FP8 (8 x 8 blocks, so that the tiny
widths split into whole blocks over two ranks), built with ``load_format="dummy"``: the projections and the
routed-expert stacks really fp8, the rows written; the floor of a quantized model counted at its stored size; a
world whose ranks would cut an FP8 block refused before anything runs."""

from __future__ import annotations

import json

import pytest
import torch

from outpace import LLM
from outpace.bench.families import QUANTIZATION_CONFIGS, step_budget
from outpace.bench.family_shapes import STEP3P5_FLASH, shrink
from outpace.bench.gpu import engine_8b
from outpace.bench.multi_gpu import run_multi_gpu_bench
from outpace.bench.multi_gpu_plan import Plan, fp8_split_refused, step35flash_fp8
from outpace.bench.oracle import ORACLE_LABEL
from outpace.layers.quant.experts import QuantizedStackedWeight

BLOCK = [8, 8]
STEP_TINY = {
    **shrink(STEP3P5_FLASH, 4),
    "quantization_config": {**QUANTIZATION_CONFIGS["fp8"], "weight_block_size": BLOCK},
}
BATCHES = (1, 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("step35flash")
    plan = Plan(
        device="cpu",
        step35flash_model=STEP_TINY,
        batches=BATCHES,
        context=16,
        decode_steps=3,
        oracle_steps=2,
        time_limit_s=900,
    )
    run_multi_gpu_bench(root / "out", "step35flash", plan, root / "work")
    return json.loads((root / "out" / "multi_gpu.json").read_text())


def test_rows_at_ep2(run):
    assert run["errors"] == {} and run["not_run"] == [], (run["errors"], run["not_run"])
    step = run["step35flash"]
    assert step["ep"] == step["tp"] == 2 and "200 GB" in step["weights"]
    reduces = {r["batch"]: r for r in step["all_reduce"]}
    assert set(reduces) == set(BATCHES)
    assert all(r["all_reduces"] == 2 * STEP_TINY["num_hidden_layers"] for r in reduces.values())
    decode = {r["batch"]: r for r in step["decode"]}
    assert set(decode) == set(BATCHES)
    for batch, r in decode.items():
        assert r["ep"] == 2 and r["tokens_per_s"] > 0 and r["floor_bytes_per_gpu"] > 0
        assert r["all_reduce_seconds"] == reduces[batch]["seconds"]
        assert r["floor_tokens_per_s"] == pytest.approx(
            batch / (r["read_seconds"] + r["all_reduce_seconds"])
        )
    assert (
        decode[2]["floor_bytes_per_gpu"] > decode[1]["floor_bytes_per_gpu"]
    )  # more experts chosen
    assert {r["batch"] for r in step["oracle"]} == set(BATCHES)
    assert all(r["label"] == ORACLE_LABEL and r["method"] == "mtp" for r in step["oracle"])
    assert "step35flash EP = TP = 2 batch 1 of floor >= 0.75" in run["targets"]


def test_the_built_engines_hold_fp8(run):
    """Every projection fp8 but the per-head attention gates (and the MTP layer's eh_proj); each MoE layer's
    three expert stacks fp8 (the plain engine: 1 MoE layer, the MTP engine: its MoE MTP layer too)."""
    engines = {e["engine"]: e for e in run["step35flash"]["engines"]}
    assert set(engines) == {"plain", "mtp"}
    for what, moe_layers, bf16 in (("plain", 1, ["g_proj"]), ("mtp", 2, ["eh_proj", "g_proj"])):
        engine = engines[what]
        assert [r["rank"] for r in engine["ranks"]] == [0, 1]
        q = engine["quantized"]
        assert q["expert_stacks"] == 3 * moe_layers, q
        assert q["projections"] > 0 and q["high_precision_linears"] == bf16, q
        # (the rest of a tiny rank: mostly its rotary tables, embedding and head)
        assert 0 < q["quantized_bytes"] < q["total_bytes"], q


def test_the_floor_counts_fp8_as_stored(tmp_path):
    """bench/families.py ``step_budget`` of the dummy FP8 model: one routed expert is its three fp8 stacks'
    rows (1 byte a value) plus their float32 block scales, half the bf16 bytes and a little; the quantized
    projections count at their stored size too."""
    model, kwargs = engine_8b(tmp_path / "step", None, 16, 2, config=STEP_TINY, device="cpu")
    with LLM(model, **kwargs) as llm:
        stacks = [m for m in llm.engine.model.modules() if isinstance(m, QuantizedStackedWeight)]
        assert len(stacks) == 3 and all(s.weight.dtype == torch.float8_e4m3fn for s in stacks)
        budget = step_budget(llm, STEP_TINY)
        hidden, inter = STEP_TINY["hidden_size"], STEP_TINY["moe_intermediate_size"]
        values = 3 * hidden * inter  # gate, up [inter, hidden], down [hidden, inter]
        scales = 3 * (hidden // BLOCK[0]) * (inter // BLOCK[1]) * 4
        assert budget.expert == values + scales
        stored = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
        routed = STEP_TINY["moe_num_experts"] * budget.expert
        assert budget.always + routed + budget.embedding_row * STEP_TINY["vocab_size"] == stored


def test_a_world_that_cuts_a_block_is_refused(tmp_path):
    """The real model splits into whole 128 x 128 blocks over 2 ranks only: its shared expert's 1280 rows are 2.5
    blocks a rank at 4 ranks."""
    full = step35flash_fp8()
    assert fp8_split_refused(full, 2) is None
    why = fp8_split_refused(full, 4)
    assert "share_expert_dim 1280 / 4 ranks = 320" in why and why.startswith("step35flash")
    assert fp8_split_refused(STEP_TINY, 2) is None
    with pytest.raises(ValueError, match="step35flash at EP = TP = 8"):
        run_multi_gpu_bench(tmp_path / "out", "step35flash", Plan(device="cpu", world=8), tmp_path)
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_defaults():
    plan = Plan()
    model = plan.step35flash_model
    assert model["num_hidden_layers"] == 45 and len(model["layer_types"]) == 45
    assert model["moe_layers_enum"] == ",".join(str(i) for i in range(3, 45))
    assert model["quantization_config"]["weight_block_size"] == [128, 128]
    assert "num_nextn_predict_layers" in model and model["num_nextn_predict_layers"] == 0
