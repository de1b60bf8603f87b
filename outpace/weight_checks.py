"""Checks of the weights a checkpoint load copies into a model: a stored dtype the parameter cannot
take, and values that are not finite. Each problem is a sentence about one tensor; the loader
(checkpoint.py) names the file and raises.

Dtype: a floating-point parameter takes floating-point tensors only (an int32 or bool tensor cast to
float is garbage). A parameter whose checkpoint form is another dtype (e.g. a future quantization
method's packed integer weight, dequantized on load) declares the dtypes it takes in a
``checkpoint_dtypes`` attribute, set by the layer that creates it.

Finiteness (NaN, +-inf): checked on the loaded parameter, after the copy and the dtype conversion, so a
value that overflows the loaded dtype (float32 1e5 as float16) is caught too. The cost is one fused
reduction per tensor on the device holding it, queued without a host sync, and one sync at the end.
The reduction is a float32 sum: a NaN or an inf makes it NaN or inf, so a finite sum clears the
tensor. A finite tensor whose sum overflows float32 (values near 1e38) is a false alarm that the exact
count, run on the flagged tensors only, clears. (``torch.isfinite(t).all()`` costs 4x (an 8B model on
an H200) to 14x (the CPU) as much: it writes a boolean tensor as large as ``t`` before reducing it;
benchmarks/scripts/load_check_cost.py measures both.)

Sign: a quantization scale (a tensor a module names in its ``checkpoint_scales``: block FP8's
``weight_scale_inv``, per-tensor and per-channel ``weight_scale`` / ``input_scale``, INT4's group
``weight_scale``) must not be negative as well as finite: a negative one flips its block's sign, which no
quantizer writes. Zero stays allowed: an all-zero block's scale, and ModelOpt's ``input_scale`` of an expert
that calibration never routed to (vLLM takes the experts' largest). One more reduction per scale tensor (its
minimum, queued beside its sum: the same one host sync); the negative values are counted on the flagged
tensors only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch


def dtype_problem(stored: torch.dtype, param: torch.Tensor) -> str | None:
    """Why a checkpoint tensor of dtype ``stored`` cannot load into ``param``; None when it can."""
    declared = getattr(param, "checkpoint_dtypes", None)
    if declared is not None:
        if stored in declared:
            return None
        allowed = ", ".join(_name(d) for d in declared)
        return f"has dtype {_name(stored)}, the model expects one of {allowed}"
    if param.is_floating_point() and not stored.is_floating_point:
        return f"has dtype {_name(stored)}, the model expects floating point ({_name(param.dtype)})"
    return None


@dataclass(frozen=True)
class Loaded:
    """A tensor copied into a parameter: where it came from, the parameter holding it, and a way to
    read the stored tensor again (run only to explain a failure)."""

    name: str
    path: Path
    param: torch.Tensor
    stored_dtype: torch.dtype
    read_stored: Callable[[], torch.Tensor]
    scale: bool = False  # a quantization scale: no value may be negative either


class FinitenessCheck:
    """Collects the loaded floating-point parameters' sums (and the scales' minima) on their device;
    ``problems`` syncs once."""

    def __init__(self) -> None:
        self._loaded: list[Loaded] = []
        self._sums: list[torch.Tensor] = []  # 0-dim float32 each, on the parameter's device
        self._scales: list[Loaded] = []
        self._minima: list[torch.Tensor] = []  # 0-dim float32 each: a scale's smallest value

    def add(self, loaded: Loaded) -> None:
        if loaded.param.is_floating_point():
            self._loaded.append(loaded)
            self._sums.append(loaded.param.detach().sum(dtype=torch.float32))
            if loaded.scale and loaded.param.numel():
                self._scales.append(loaded)
                self._minima.append(loaded.param.detach().amin().float())

    def problems(self) -> list[tuple[Loaded, str]]:
        """The tensors holding a NaN or an inf, then the scales holding a negative value,
        each with what is wrong; [] when all are fine."""
        if not self._sums:
            return []
        flags = torch.isfinite(torch.stack(self._sums))
        if self._minima:  # (a NaN minimum compares False: flagged too)
            flags = torch.cat([flags, torch.stack(self._minima) >= 0])
        ok = flags.tolist()  # the one host sync
        finite, signed = ok[: len(self._loaded)], ok[len(self._loaded) :]
        found = [(loaded, _nonfinite(loaded)) for loaded, f in zip(self._loaded, finite) if not f]
        found += [(loaded, _negative(loaded)) for loaded, p in zip(self._scales, signed) if not p]
        found = [(loaded, problem) for loaded, problem in found if problem is not None]
        first: dict[str, tuple[Loaded, str]] = {}  # (a NaN scale is flagged twice: once)
        for loaded, problem in found:
            first.setdefault(loaded.name, (loaded, problem))
        return list(first.values())


def _nonfinite(loaded: Loaded) -> str | None:
    """The NaN and inf values of a flagged parameter counted exactly (None: a false alarm)."""
    param = loaded.param.detach()
    values = param.float() if param.element_size() == 1 else param  # (no isinf for float8 types)
    nan, inf = int(values.isnan().sum()), int(values.isinf().sum())
    if not nan and not inf:
        return None
    counts = " and ".join(
        f"{n} {what} value{'s' if n > 1 else ''}" for n, what in ((nan, "NaN"), (inf, "inf")) if n
    )
    stored, loaded_as = _name(loaded.stored_dtype), _name(param.dtype)
    if stored != loaded_as and torch.isfinite(loaded.read_stored().float()).all():
        return (
            f"has {counts} once converted to {loaded_as}: its {stored} values are finite but "
            f"beyond {loaded_as}'s range (load the model in a dtype that holds them)"
        )
    return f"has {counts}"


def _negative(loaded: Loaded) -> str | None:
    """The negative values of a flagged scale, counted (None: a NaN, which the finiteness check reports)."""
    values = loaded.param.detach().float()
    bad = values < 0
    n = int(bad.sum())
    if not n:
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    where = f" at index {list(index)}" if index else ""
    return (
        f"is a quantization scale with {n} value{'s' if n > 1 else ''} that {'are' if n > 1 else 'is'} "
        f"negative ({values[index].item():g}{where}{', ...' if n > 1 else ''}): a scale must be finite "
        "and not negative"
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
