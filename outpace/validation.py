"""The checks every config and request parameter runs: pure functions, no torch.

An invalid value raises ``ConfigError`` naming its owner (a dataclass) and field, the value and what
is allowed, so the message says what to change.
"""

from __future__ import annotations

import math
import sys
from typing import Any

INT64_MAX = 2**63 - 1  # the engine keeps request integers (seeds, top-k, token ids) in int64 rows


class ConfigError(ValueError):
    """A configuration value is outside its allowed range."""


def require(owner: str, name: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise ``ConfigError`` for ``owner.name=value`` unless ``ok``; ``allowed`` says what may be given."""
    if not ok:
        raise ConfigError(f"{owner}.{name}={value!r} is invalid: must be {allowed}")


def is_int(value: Any) -> bool:
    """An int and not a bool (``True`` is an int to Python, never a count or an id here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_int64(value: Any) -> bool:
    """An int (not a bool) that an int64 holds."""
    return is_int(value) and -INT64_MAX - 1 <= value <= INT64_MAX


def is_finite_number(value: Any) -> bool:
    """An int or a float (not a bool), neither infinite nor NaN nor beyond the largest float."""
    if isinstance(value, float):
        return math.isfinite(value)
    return is_int(value) and abs(value) <= sys.float_info.max


def require_positive_int(owner: str, name: str, value: Any) -> None:
    require(owner, name, value, is_int64(value) and value > 0, "a positive integer (int64)")
