"""``outpace bench multi`` (outpace/bench/multi_gpu.py) end to end on CPU processes (gloo, TP = 2) with tiny
stand-ins for the 8B and 70B shapes: every part writes its rows; correctness finds TP = 2 equal to TP = 1
and the drafter lossless, and reports a run whose output differs from its reference as a mismatch; the
speed rows carry their floors, all-reduce times and labelled oracle rows; the data-parallel part serves
one replica and then two behind one server; the table's targets come from the rows."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from outpace.bench.multi_gpu import run_multi_gpu_bench
from outpace.bench.multi_gpu_measures import compare
from outpace.bench.multi_gpu_plan import Case, Plan
from outpace.bench.oracle import ORACLE_LABEL
from outpace.bench.random_checkpoint import random_target
from outpace.cli import parse_args
from outpace.cli.bench import multi_plan

TINY = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
TINY_WIDE = {
    **TINY,
    "hidden_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}  # the "70b" stand-in
BATCHES = (1, 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("multi")
    work = root / "work"
    # a case whose TP = 2 model differs from its TP = 1 reference: the correctness part must flag it
    other = random_target(work / "other", TINY, seed=1)
    plan = Plan(
        device="cpu",
        shapes={"8b": TINY, "70b": TINY_WIDE},
        widen_to=None,
        zoo_targets=("tinypy",),
        drafters=("eagle3",),
        family_drafters=(),
        cases=(Case("mismatch", str(other), str(work / "random-8b"), ("float32",)),),
        prompts=2,
        tokens=8,
        batches=BATCHES,
        context=16,
        decode_steps=4,
        speed_tokens=8,
        batch1_prompts=1,
        eagle3_steps=2,
        eagle3_adaptive=False,
        oracle_steps=2,
        dp_streams=2,  # the fewest streams that two client processes split
        dp_requests=4,
        dp_max_tokens=4,
        dp_kv_blocks=256,
        dp_saturated_streams=4,
        dp_client_processes=2,
        time_limit_s=900,
        dp_reserve_s=300,
    )
    out = root / "out"
    run_multi_gpu_bench(out, "correctness,tp_speed,dp,dp_eagle3", plan, work)
    return json.loads((out / "multi_gpu.json").read_text()), out


def test_every_part_ran(run):
    result, out = run
    assert result["errors"] == {} and result["not_run"] == []
    assert {"correctness", "tp_speed", "dp", "dp_eagle3", "targets"} <= set(result)
    assert (out / "multi_gpu.png").is_file()


def test_correctness_rows_and_a_mismatch_is_caught(run):
    corr = run[0]["correctness"]
    rows = {(r["model"], r["dtype"]): r for r in corr["tp_equality"]}
    assert set(rows) == {
        ("tinypy", "float32"),
        ("tinypy", "bfloat16"),
        ("random-8b", "float32"),
        ("random-8b", "bfloat16"),
        ("mismatch", "float32"),
    }
    for (model, dtype), r in rows.items():
        if model != "mismatch" and dtype == "float32":
            assert r["equal"] and r["match_rate"] == 1.0 and r["first_mismatch"] is None, model
        elif (
            model != "mismatch"
        ):  # bf16 sums the shards' partial products in another order: a reported rate
            assert 0.0 < r["match_rate"] <= 1.0 and r["equal"] == (r["first_mismatch"] is None), (
                model
            )
    bad = rows["mismatch", "float32"]
    assert not bad["equal"] and bad["match_rate"] < 1.0 and bad["first_mismatch"] is not None
    assert corr["all_tp_equal_fp32"] is False  # the verdict reports it
    assert run[0]["targets"]["tp_equal_fp32"]["met"] is False
    (lossless,) = corr["lossless"]
    assert lossless["drafter"] == "eagle3" and lossless["equal"] and lossless["tau"] > 1.0
    assert corr["all_lossless_fp32"] is True


def test_speed_rows_carry_their_floor(run):
    tp = run[0]["tp_speed"]
    decode = {(r["shape"], r["tp"], r["batch"]): r for r in tp["decode"]}
    assert set(decode) == {(s, t, b) for s in ("8b", "70b") for t in (1, 2) for b in BATCHES}
    reduces = {(r["shape"], r["batch"]): r for r in tp["all_reduce"]}
    assert set(reduces) == {(s, b) for s in ("8b", "70b") for b in BATCHES}
    assert all(
        r["all_reduces"] == 2 * TINY["num_hidden_layers"] and r["seconds"] > 0
        for r in reduces.values()
    )
    for (shape, size, batch), r in decode.items():
        assert (
            r["tokens_per_s"] > 0
            and r["weight_bytes_per_gpu"] > 0
            and r["kv_bytes_per_token_per_gpu"] > 0
        )
        assert r["all_reduce_seconds"] == (reduces[shape, batch]["seconds"] if size == 2 else 0.0)
        assert r["floor_tokens_per_s"] == pytest.approx(
            batch / (r["read_seconds"] + r["all_reduce_seconds"])
        )
        assert r["fraction_of_floor"] == pytest.approx(r["tokens_per_s"] / r["floor_tokens_per_s"])
    # each rank holds half of the weights the one-rank engine holds (the vocabulary padded to 64 per rank)
    assert (
        decode["70b", 2, 1]["weight_bytes_per_gpu"]
        < 0.6 * decode["70b", 1, 1]["weight_bytes_per_gpu"]
    )
    eagle = {(r["method"], r["batch"]): r for r in tp["eagle3"]}
    assert set(eagle) == {(m, b) for m in ("none", "eagle3") for b in BATCHES}
    # the speed rows run in bf16, where a k+1-token verify may round differently from a one-token step, so the
    # match with plain greedy is a reported rate; losslessness is checked in fp32 by the correctness part
    assert all(
        eagle["eagle3", b]["tau"] > 1.0
        and 0.0 < eagle["eagle3", b]["match_plain_greedy"] <= 1.0
        and eagle["eagle3", b]["speedup"] > 0
        for b in BATCHES
    )
    oracle = {(r["shape"], r["batch"]) for r in tp["oracle"]}
    assert oracle == {(s, b) for s in ("zoo", "70b") for b in BATCHES}
    assert all(
        r["label"] == ORACLE_LABEL and 0 in {int(k) for k in r["step_ms"]} for r in tp["oracle"]
    )


@pytest.mark.parametrize("part", ["dp", "dp_eagle3"])
def test_data_parallel_rows(run, part):
    """Plain decoding (``dp``) and EAGLE3 (``dp_eagle3``, the zoo draft on this CPU plan) served by one replica (in
    the server's process and in its own) and by two: every request answered, the ratios from the rows, target
    lines for each part."""
    dp = run[0][part]
    assert dp["drafter"] == (
        "--method none"
        if part == "dp"
        else f"--method eagle3 --draft {Path(__file__).resolve().parents[2] / 'zoo' / 'tinypy-eagle3'} "
        "--num-steps 2"
    )
    for key in ("one_replica", "one_replica_own_process", "two_replicas"):
        assert (
            dp[key]["num_failed"] == 0
            and dp[key]["num_requests"] == 4
            and dp[key]["output_tokens"] > 0
        )
        assert (
            dp[key]["client_processes"] == 2
        )  # the load split over two client processes, every request counted
    assert dp["mode"] == "outpace serve --data-parallel-size 2"
    assert dp["output_tokens_per_s_ratio"] == pytest.approx(
        dp["two_replicas"]["output_tokens_per_s"] / dp["one_replica"]["output_tokens_per_s"]
    )
    assert dp["output_tokens_per_s_ratio_own_process"] == pytest.approx(
        dp["two_replicas"]["output_tokens_per_s"]
        / dp["one_replica_own_process"]["output_tokens_per_s"]
    )
    saturated = dp["saturated"]  # the second level: twice the streams, as many requests per stream
    assert (saturated["streams"], saturated["requests"], dp["streams"], dp["requests"]) == (
        4,
        8,
        2,
        4,
    )
    for key in ("one_replica", "one_replica_own_process", "two_replicas"):
        assert saturated[key]["num_failed"] == 0 and saturated[key]["num_requests"] == 8
    assert saturated["output_tokens_per_s_ratio"] == pytest.approx(
        saturated["two_replicas"]["output_tokens_per_s"]
        / saturated["one_replica"]["output_tokens_per_s"]
    )
    with_drafter = "" if part == "dp" else f" with {dp['drafter']}"
    assert (
        f"dp2_over_one{with_drafter} at 4 streams (saturated, output tokens/s)" in run[0]["targets"]
    )
    assert (
        run[0]["targets"][f"dp2_over_one{with_drafter} >= 1.9 (output tokens/s)"]["value"]
        == dp["output_tokens_per_s_ratio"]
    )
    assert (
        run[0]["targets"][
            f"dp2_over_one{with_drafter}, one replica with --engine-process (output tokens/s)"
        ]["value"]
        == dp["output_tokens_per_s_ratio_own_process"]
    )


def test_compare_finds_the_first_difference():
    outs = [SimpleNamespace(token_ids=[1, 2, 3]), SimpleNamespace(token_ids=[4, 5])]
    assert compare([[1, 2, 3], [4, 5]], outs) == {
        "equal": True,
        "match_rate": 1.0,
        "first_mismatch": None,
    }
    got = compare([[1, 2, 3], [4, 6]], outs)
    assert (
        not got["equal"]
        and got["first_mismatch"] == [1, 1]
        and got["match_rate"] == pytest.approx(4 / 5)
    )
    assert compare([[1, 2, 3, 9], [4, 5]], outs)["first_mismatch"] == [
        0,
        3,
    ]  # a shorter output differs too


def test_cli_and_part_names(tmp_path):
    a = parse_args(["bench", "multi", "--parts", "single", "--out", str(tmp_path)])
    assert (a.what, a.parts, a.time_limit, a.dp_reserve) == ("multi", "single", None, None)
    a = parse_args(
        ["bench", "multi", "--time-limit", "300", "--dp-reserve", "90", "--dp-streams", "64"]
    )
    plan = multi_plan(a)
    assert (plan.time_limit_s, plan.dp_reserve_s, plan.dp_streams, plan.dp_saturated_streams) == (
        300,
        90,
        64,
        None,
    )
    plan = multi_plan(parse_args(["bench", "multi", "--dp-streams", "32", "128"]))
    assert (plan.dp_streams, plan.dp_saturated_streams, plan.time_limit_s) == (
        32,
        128,
        Plan().time_limit_s,
    )
    with pytest.raises(ValueError, match="--dp-streams 64 0 is invalid"):
        multi_plan(parse_args(["bench", "multi", "--dp-streams", "64", "0"]))
    assert (multi_plan(parse_args(["bench", "multi", "--gpus", "4"])).world, Plan().world) == (4, 2)
    with pytest.raises(ValueError, match="--gpus 1 is invalid"):
        multi_plan(parse_args(["bench", "multi", "--gpus", "1"]))
    assert multi_plan(parse_args(["bench", "multi"])).seed_oracle
    assert not multi_plan(parse_args(["bench", "multi", "--no-oracle"])).seed_oracle
    assert parse_args(["bench", "gpu"]).parts is None  # bench gpu's own default (abef) applies
    with pytest.raises(ValueError, match="unknown part"):
        run_multi_gpu_bench(tmp_path, "correctness,speed", Plan(device="cpu"), tmp_path / "work")


def test_a_run_continues_an_earlier_one():
    """Items an earlier run into OUT finished are kept with their rows; its errors and skipped items are
    retried (the device's ten-minute commands: one bench as the same command repeated)."""
    from outpace.bench.multi_gpu import Run, continued
    from outpace.bench.multi_gpu_plan import Clock

    earlier = {
        "parts": ["correctness"],
        "copy_bandwidth_bytes_per_s": 1e12,
        "device": "GPU",
        "correctness": {
            "tp_equality": [
                {"model": "a", "item": "correctness: a float32"},
                {"model": "b", "partial": True, "item": "correctness: b"},
            ],
            "lossless": [],
        },
        "done": ["correctness: a float32"],
        "seconds": {"correctness: a float32": 3.0, "correctness: b": 1.0},
        "errors": {"correctness: b": "RuntimeError: boom"},
        "not_run": ["tp_speed: 70b: 5 s left"],
    }
    fresh = {"parts": ["tp_speed"], "errors": {}, "not_run": [], "seconds": {}, "done": []}
    result = continued(earlier, fresh)
    assert (
        result["parts"] == ["correctness", "tp_speed"]
        and result["correctness"] == earlier["correctness"]
    )
    result["correctness"] = {k: [dict(r) for r in v] for k, v in result["correctness"].items()}
    assert result["copy_bandwidth_bytes_per_s"] == 1e12 and result["done"] == [
        "correctness: a float32"
    ]
    assert result["seconds"] == {"correctness: a float32": 3.0} and result["errors"] == {}
    assert result["earlier_run"]["errors"] == earlier["errors"]

    class Group:
        healthy = True

        def settled(self):
            return True

    ran = []
    run = Run(Group(), Plan(device="cpu"), result, Path("/dev/null"), Path("."), Clock(60.0))
    run.save = lambda: None
    rows = result["correctness"]["tp_equality"]
    run.item("correctness: a float32", 1.0, lambda: ran.append("a"))
    run.item("correctness: b", 1.0, lambda: (ran.append("b"), run.add(rows, {"model": "b"})))
    run.item("tp_speed: 70b", 1e6, lambda: ran.append("70b"))
    assert ran == ["b"] and result["done"] == ["correctness: a float32", "correctness: b"]
    # the retried item's partial row from the failed run is replaced by its new row
    assert rows == [
        {"model": "a", "item": "correctness: a float32"},
        {"model": "b", "item": "correctness: b"},
    ]
    assert result["not_run"] and result["not_run"][0].startswith("tp_speed: 70b")


def test_a_run_on_another_gpu_drops_the_earlier_timings():
    from outpace.bench.multi_gpu import forget_timings

    result = {
        "tp_speed": {"decode": [1]},
        "dp": {"x": 1},
        "dp_eagle3": {"x": 2},
        "copy_bandwidth_bytes_per_s": 3e12,
        "correctness": {"tp_equality": [1]},
        "done": ["tp_speed: 8b plain TP = 1", "correctness: a", "dp", "dp_eagle3"],
        "seconds": {
            "tp_speed: 8b plain TP = 1": 30.0,
            "correctness: a": 2.0,
            "dp": 100.0,
            "dp_eagle3": 90.0,
        },
    }
    forget_timings(result, "measured on H100, this run is on H200")
    assert not {"tp_speed", "dp", "dp_eagle3", "copy_bandwidth_bytes_per_s"} & set(result)
    assert result["correctness"] == {"tp_equality": [1]} and result["done"] == ["correctness: a"]
    assert (
        result["seconds"] == {"correctness: a": 2.0}
        and "H200" in result["earlier_run"]["timings_dropped"]
    )


@pytest.mark.parametrize("oracle", [True, False])
def test_the_seed_models_oracle_items_follow_the_plan(oracle):
    """``seed_oracle`` (--no-oracle): a seed model's items are its all-reduces and plain decode, and its MTP
    item under ORACLE acceptance only where the plan asks for it."""
    from types import SimpleNamespace

    from outpace.bench.multi_gpu_seed import seed_items

    items = []
    run = SimpleNamespace(
        plan=Plan(device="cpu", seed_oracle=oracle),
        group=SimpleNamespace(world=2),
        item=lambda name, seconds, fn: items.append(name),
    )
    seed_items(run, "ep: x", "EP = 2", "x", {}, {}, 10.0)
    assert items == ["ep: x: all-reduces", "ep: x: plain EP = 2"] + (
        ["ep: x: MTP ORACLE EP = 2"] if oracle else []
    )
