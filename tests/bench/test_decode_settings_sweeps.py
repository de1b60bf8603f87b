"""benchmarks/scripts/decode_settings.py's sweeps, checked on the CPU before a device call spends time on them:
every knob a setting names exists, with a value of the shipped value's kind, and every shape is one the script
builds, in its quantization. (A shape without a time estimate once stopped a device call at once:
gpu_2026-12-05c call 2.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers.bench_scripts import load_bench_script
from outpace.bench.families import bench_shapes
from outpace.bench.family_shapes import family_shapes

pytest.importorskip("triton")


def _same_kind(module, attr: str, value) -> bool:
    """Whether a setting's value can stand for the shipped ``module.attr``: a number for a number, a flag for a
    flag, a tuple as long, a dict over the shipped keys; None where the shipped value is None or its annotation
    allows None."""
    shipped = getattr(module, attr)
    if value is None:
        return shipped is None or "None" in str(
            getattr(module, "__annotations__", {}).get(attr, "")
        )
    if isinstance(shipped, bool) or isinstance(value, bool):
        return isinstance(shipped, bool) and isinstance(value, bool)
    if shipped is None or isinstance(shipped, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(shipped, tuple):
        return isinstance(value, tuple) and len(value) == len(shipped)
    if isinstance(shipped, dict):
        return isinstance(value, dict) and set(value) <= set(shipped)
    return type(value) is type(shipped)


def _sweep_errors(script) -> list[str]:
    """What is wrong with the script's knobs and sweeps, one line each."""
    errors = [
        f"knob {knob}: {module.__name__} has no {attr}"
        for knob, (module, attr) in script.KNOBS.items()
        if not hasattr(module, attr)
    ]
    shapes = set(family_shapes())
    for name, sweep in script.SWEEPS.items():
        if sweep.shape not in shapes:
            errors.append(f"sweep {name}: unknown shape {sweep.shape}")
        elif sweep.quantized:
            try:
                bench_shapes(sweep.quantized, [sweep.shape])
            except ValueError as e:
                errors.append(f"sweep {name}: {e}")
        if sweep.settings[0] != {}:
            errors.append(f"sweep {name}: the shipped values come first")
        if not all(b >= 1 and c >= 1 for b, c in sweep.points):
            errors.append(f"sweep {name}: points {sweep.points}")
        for setting in sweep.settings:
            for knob, value in setting.items():
                if knob not in script.KNOBS:
                    errors.append(f"sweep {name}: no knob {knob}")
                elif not _same_kind(*script.KNOBS[knob], value):
                    errors.append(f"sweep {name}: {knob}={value!r}")
    return errors


def test_every_sweep_names_known_knobs_and_shapes():
    assert _sweep_errors(load_bench_script("decode_settings")) == []


def test_a_wrong_knob_value_or_shape_is_named():
    script = load_bench_script("decode_settings")
    sweep = script.SWEEPS["a3b_qwen3"]
    script.SWEEPS["a3b_qwen3"] = script.Sweep(
        sweep.shape, sweep.points, ({}, {"few_token_gate_up": 64})
    )
    script.SWEEPS["x"] = script.Sweep("qwen3-31b", ((1, 512),), ({}, {"gate_up_tiles": (1, 2)}))
    script.SWEEPS["y"] = script.Sweep("gemma-4-26b-a4b", ((1, 512),), ({},), quantized="fp8")
    errors = _sweep_errors(script)
    assert errors[0] == "sweep a3b_qwen3: few_token_gate_up=64"
    assert errors[1:3] == ["sweep x: unknown shape qwen3-31b", "sweep x: no knob gate_up_tiles"]
    assert len(errors) == 4 and errors[3].startswith(
        "sweep y: shape 'gemma-4-26b-a4b' with --quantized fp8"
    )


def test_sweeps_of_one_shape_share_one_engine(tmp_path, monkeypatch):
    """Several sweeps in one call: one build a run of consecutive sweeps of a shape, with every batch they time;
    each sweep's JSON beside the others; the shipped values back after each sweep. The build and the timing are
    stand-ins (the real ones need a GPU): a point takes its batch in ms, plus 1 where the gate/up tiles differ
    from the shipped ones."""
    script = load_bench_script("decode_settings")
    shipped_tiles = script.moe_kernels.few_token_gate_up
    builds = []

    def build(tmp, config, **kwargs):
        builds.append((config["shape"], kwargs["graph_sizes"]))
        return SimpleNamespace(engine=None)

    def time_decode(llm, batch, context, steps):
        return {"step_ms": batch + float(script.moe_kernels.few_token_gate_up != shipped_tiles)}

    monkeypatch.setattr(script, "_config", lambda sweep: {"shape": sweep.shape})
    monkeypatch.setattr(script, "build", build)
    monkeypatch.setattr(script, "close", lambda llm: None)
    monkeypatch.setattr(script, "_recapture_decode", lambda engine: None)
    monkeypatch.setattr(script, "time_decode", time_decode)
    script.main(str(tmp_path), "a3b_qwen3", "gate_up_n16_qwen3", "swiglu_llama")

    assert builds == [("qwen3-30b-a3b", (1, 8)), ("llama-3.1-8b", (1, 8))]
    assert script.moe_kernels.few_token_gate_up == shipped_tiles
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a3b_qwen3.json",
        "gate_up_n16_qwen3.json",
        "swiglu_llama.json",
    ]
    report = json.loads((tmp_path / "gate_up_n16_qwen3.json").read_text())
    sweep = script.SWEEPS["gate_up_n16_qwen3"]
    assert report["shape"] == "qwen3-30b-a3b"
    assert len(report["rows"]) == len(sweep.settings) * len(sweep.points)
    for row in report["rows"]:
        assert row["step_ms"] == row["batch"] + (row["setting"] != {})

    script.main(str(tmp_path / "one.json"), "swiglu_llama")  # one sweep: OUT is its JSON
    assert json.loads((tmp_path / "one.json").read_text())["shape"] == "llama-3.1-8b"
