"""bench/family_shapes.py and the floor of bench/families.py: every seed-family shape, shrunk (same
architecture, fields and layer pattern at tiny sizes), loads through outpace and decodes on the CPU; the
floor's expert count and byte sums are checked against hand counts; on a GPU, the bench runs end to end
on the shrunk shapes."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from outpace import LLM, SamplingParams
from outpace.bench.families import StepBudget, distinct_experts, step_budget, step_bytes
from outpace.bench.family_shapes import FamilyShape, family_shapes, shrink
from outpace.model_config import ModelConfig

SHAPES = family_shapes()
GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def tiny_llm(shape: FamilyShape, tmp_path) -> tuple[dict, LLM]:
    config = shrink(shape.config, shape.tiny_layers)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    kwargs = dict(device="cpu", dtype="float32", load_format="dummy", max_num_seqs=2)
    return config, LLM(str(tmp_path), num_kv_blocks=16, block_size=16, **kwargs)


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_shape_shrunk_loads_and_decodes_on_the_cpu(name, tmp_path):
    shape = SHAPES[name]
    full = ModelConfig.from_dict(
        shape.config
    )  # the public shape itself is a config outpace accepts
    config, llm = tiny_llm(shape, tmp_path)
    assert set(config) == set(shape.config)  # same fields
    assert llm.engine.model_config.architecture == full.architecture
    assert llm.engine.model_config.hidden_size < 100 < full.hidden_size
    for key in ("layer_types", "hybrid_override_pattern", "rope_theta"):
        if isinstance(config.get(key), (list, str)):
            assert len(config[key]) == shape.tiny_layers == config["num_hidden_layers"]
    outs = llm.generate([[5, 9, 2, 7, 1], [3, 4]], GREEDY)
    assert [len(o.token_ids) for o in outs] == [3, 3]
    assert shape.is_slice == (shape.config["num_hidden_layers"] < shape.full_layers)


def test_expected_distinct_experts_is_the_mean_over_every_routing():
    """Two tokens each choosing 2 of 4 experts: the union's size over all 36 equally likely choices."""
    choices = list(itertools.combinations(range(4), 2))
    unions = [len(set(a) | set(b)) for a, b in itertools.product(choices, choices)]
    assert sum(unions) / len(unions) == 3.0 == pytest.approx(distinct_experts(4, 2, 2))
    assert distinct_experts(4, 2, 1) == pytest.approx(2.0)  # one token: its own top-k
    assert distinct_experts(0, 0, 8) == 0.0  # a dense model


def test_step_bytes_by_hand():
    budget = StepBudget(
        always=1000,
        embedding_row=10,
        expert=100,
        moe_layers=2,
        num_experts=4,
        top_k=2,
        kv_rows=((8, None), (8, 2)),  # a full layer and a sliding one of window 2
        state=5,
    )
    # batch 2, one token after 5 cached: 2 embedding rows, 2 MoE layers x 3 expected experts x 100,
    # per sequence 6 rows of the full layer and 2 of the sliding one x 8 bytes, the state read and written
    assert step_bytes(budget, batch=2, context=5) == 1000 + 2 * 10 + 600 + 2 * (48 + 16) + 2 * 2 * 5
    # two tokens each: 4 tokens choose 4 (1 - 1/16) = 3.75 experts per layer
    assert step_bytes(budget, batch=2, context=5, tokens=2) == pytest.approx(
        1000 + 4 * 10 + 2 * 3.75 * 100 + 2 * (8 * 7 + 8 * 2) + 2 * 2 * 5
    )


def test_step_budget_of_a_tiny_deepseek_v3(tmp_path):
    config, llm = tiny_llm(SHAPES["deepseek-v3-slice"], tmp_path)
    budget = step_budget(llm, config)
    f32, hidden = 4, config["hidden_size"]
    assert (budget.num_experts, budget.top_k, budget.moe_layers) == (16, 4, 1)
    assert budget.expert == 3 * config["moe_intermediate_size"] * hidden * f32  # gate, up, down
    assert budget.embedding_row == hidden * f32  # the head is untied: the table is read by row
    latent = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * f32
    assert budget.kv_rows == ((latent, None),) * config["num_hidden_layers"]
    assert budget.state == 0
    total = sum(p.numel() * f32 for p in llm.engine.model.parameters())
    table = config["vocab_size"] * hidden * f32
    assert budget.always + budget.moe_layers * 16 * budget.expert + table == total


def test_step_budget_of_tied_sliding_and_recurrent_shapes(tmp_path):
    config, llm = tiny_llm(SHAPES["gemma-3-12b"], tmp_path / "gemma")
    budget = step_budget(llm, config)
    assert (
        budget.embedding_row == 0 and budget.moe_layers == 0
    )  # tied: the head reads the table whole
    windows = [w for _, w in budget.kv_rows]
    assert windows == [8, 8, 8, 8, 8, None]  # 5 sliding layers to 1 global one
    total = sum(p.numel() * 4 for p in llm.engine.model.parameters())
    assert budget.always == total
    config, llm = tiny_llm(SHAPES["qwen3.5"], tmp_path / "qwen")
    budget = step_budget(llm, config)
    assert len(budget.kv_rows) == 1  # 3 DeltaNet layers to 1 attention layer
    assert budget.state == sum(
        t[0].numel() * t.element_size() for t in llm.engine.runner.states.tensors()
    )
    assert budget.state > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SHAPES))
def test_the_bench_runs_on_every_shrunk_shape(name, tmp_path):
    from outpace.bench.families import BATCHES, MAX_VERIFY_TOKENS, MTP_ORACLE_SHAPES, run_shape

    shape = SHAPES[name]
    tiny = FamilyShape(name, shape.source, shrink(shape.config, shape.tiny_layers), 99, 1)
    result = run_shape(tiny, tmp_path, bandwidth=3e12)
    assert [d["batch"] for d in result["decode"]] == list(BATCHES)
    assert all(0 < d["fraction_of_floor"] for d in result["decode"])
    if name in MTP_ORACLE_SHAPES:  # its MTP layer's oracle rows in place of the n-gram sweep
        assert [r["batch"] for r in result["mtp_oracle"]["rows"]] == list(BATCHES)
    else:
        assert [len(v["ms"]) for v in result["verify"]] == [MAX_VERIFY_TOKENS] * 2
    assert result["kernels"]["kernels"] > shape.tiny_layers
    assert torch.cuda.memory_allocated() < 1 << 30  # both engines freed


def test_step_budget_leaves_a_router_inside_the_experts_out_of_them(tmp_path):
    """Step-3.5 keeps its router (``gate``) in the experts' module: read always, not per expert."""
    config, llm = tiny_llm(SHAPES["step-3.5-flash-slice"], tmp_path)
    budget = step_budget(llm, config)
    assert budget.expert == 3 * config["moe_intermediate_size"] * config["hidden_size"] * 4
    assert budget.moe_layers == 1  # layers 0-2 dense, layer 3 MoE
    assert [w for _, w in budget.kv_rows] == [None, 8, 8, 8]


def test_bench_gpu_part_s_takes_the_shapes_and_time_limit(monkeypatch, tmp_path):
    import outpace.bench.gpu as gpu
    from outpace.cli import parse_args
    from outpace.cli.bench import run

    calls = []
    monkeypatch.setattr(gpu, "run_gpu_bench", lambda out, **kw: calls.append((out, kw)))
    monkeypatch.setattr(
        "torch.cuda.is_available", lambda: True
    )  # (bench gpu refuses a machine without one)
    argv = [
        "bench",
        "gpu",
        "--parts",
        "s",
        "--shapes",
        "qwen3.5,gemma-3-12b",
        "--time-limit",
        "300",
    ]
    run(parse_args([*argv, "--out", str(tmp_path)]))
    assert calls == [
        (tmp_path, dict(parts="s", shapes=["qwen3.5", "gemma-3-12b"], time_limit_s=300.0))
    ]


def test_a_run_measures_what_is_not_measured_yet_within_its_time_limit(monkeypatch, tmp_path):
    import outpace.bench.families as families

    ran, saved = [], []
    monkeypatch.setattr(
        families, "run_shape", lambda shape, *_: ran.append(shape.name) or {"decode": []}
    )
    done = {
        "qwen3.5": {"decode": []},
        "gemma-3-12b": {"error": "x"},
        "nemotron-h-8b": {"not_run": "y"},
    }
    names = ["qwen3.5", "gemma-3-12b", "nemotron-h-8b", "kimi-k2-slice"]
    limit = families.ESTIMATE_S["nemotron-h-8b"] + 5  # kimi-k2-slice's estimate is larger
    assert families.ESTIMATE_S["kimi-k2-slice"] > limit
    out = families.run_families_bench(tmp_path, 1.0, names, limit, done, saved.append)
    assert ran == ["gemma-3-12b", "nemotron-h-8b"]  # measured: kept; an error or not run: again
    assert "not_run" in out["kimi-k2-slice"] and out["qwen3.5"] == {"decode": []}
    assert len(saved) == 2 and saved[-1] is not done  # after each shape measured
    with pytest.raises(ValueError, match="unknown shapes"):
        families.run_families_bench(tmp_path, 1.0, ["llama-9b"])


def test_every_shape_has_a_time_estimate():
    import outpace.bench.families as families

    assert set(families.ESTIMATE_S) == set(family_shapes())


def test_reports_of_parts_of_the_shapes_merge_into_one():
    from outpace.bench.families import merge_reports

    first = {"device": "H200", "shapes": {"a": {"decode": [1]}, "b": {"error": "x"}}}
    second = {"device": "H200", "shapes": {"b": {"decode": [2]}, "a": {"not_run": "y"}, "c": {}}}
    merged = merge_reports([first, second])
    assert merged["shapes"] == {"a": {"decode": [1]}, "b": {"decode": [2]}, "c": {}}
    assert merged["device"] == "H200"


@pytest.mark.parametrize("verified", [False, True])
def test_the_plot_draws_verify_curves_only_where_a_verify_ran(verified, tmp_path):
    """``--no-verify`` leaves no curve to draw: the figure is the bars alone (half as wide), not an empty panel."""
    from PIL import Image

    from outpace.bench.families import plot_families

    decode = [{"batch": b, "fraction_of_floor": 0.5} for b in (1, 8, 32)]
    shape = {"decode": decode}
    if verified:
        shape["verify"] = [{"batch": 1, "relative": [1.0, 1.2, 1.5]}]
    plot_families({"a-shape": shape}, tmp_path / "families.png")
    width = Image.open(tmp_path / "families.png").size[0]
    assert width == (1800 if verified else 900)
