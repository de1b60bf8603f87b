"""benchmarks/scripts/decode_settings.py's sweeps, checked on the CPU before a device call spends time on them:
every knob a setting names exists, with a value of the shipped value's kind, and every shape is one the script
builds, in its quantization. (A shape without a time estimate once stopped a device call at once:
gpu_2026-12-05c call 2.)"""

from __future__ import annotations

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
    shapes = set(family_shapes()) | {"llama-3.1-8b"}
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
