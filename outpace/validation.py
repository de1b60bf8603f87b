"""The checks every config and request parameter runs: pure functions, no torch.

An invalid value raises ``ConfigError`` naming its owner (a dataclass, or the file it was read from)
and field, the value and what is allowed, so the message says what to change.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

INT64_MAX = 2**63 - 1  # the engine keeps request integers (seeds, top-k, token ids) in int64 rows
# A dimension, count or length read from a config file above this is a mistake: refused before anything
# is allocated for it.
MAX_CONFIG_SIZE = 2**24


class ConfigError(ValueError):
    """A configuration value is outside its allowed range."""


class RequestFieldError(ValueError):
    """A request's sampling parameter the engine cannot serve (``LLMEngine.new_request``): ``field`` names it as
    SamplingParams does, so that the server's 400 names that field rather than the prompt."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # (it crosses to the server from a replica's process: server/replicas.py)
        return type(self), (self.field, str(self))


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


def read_json_object(path: str | Path) -> dict:
    """The object a JSON file holds (a config.json); an unreadable file, invalid JSON or another
    type at the top raises ``ConfigError`` naming the file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a JSON object, got a {type(data).__name__}")
    return data


_REQUIRED: Any = object()  # a field's default when it must be given


class ConfigFields:
    """The fields of a config file, read with their types checked: a wrong or missing value raises
    ``ConfigError`` naming the file (``source``) and the field, e.g. ``zoo/tinypy/config.json: field
    'rms_norm_eps' must be a number, got '1e-5'``. A typed read of an absent or null field gives
    its default; ``get`` reads a field as it is (null included)."""

    def __init__(self, data: dict, source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def fail(self, name: str, value: Any, allowed: str) -> ConfigError:
        """The error for field ``name`` holding ``value`` where ``allowed`` was expected."""
        return ConfigError(
            f"{self.source}: field {self.prefix + name!r} must be {allowed}, got {value!r}"
        )

    def _given(self, name: str, default: Any, allowed: str) -> Any:
        value = self.data.get(name)
        if value is None and default is _REQUIRED:
            raise ConfigError(
                f"{self.source}: field {self.prefix + name!r} is missing: must be {allowed}"
            )
        return default if value is None else value

    def integer(
        self, name: str, default: Any = _REQUIRED, minimum: int = 1, maximum: int = MAX_CONFIG_SIZE
    ) -> Any:
        allowed = f"an integer in [{minimum}, {maximum}]"
        value = self._given(name, default, allowed)
        if value is not default and not (is_int(value) and minimum <= value <= maximum):
            raise self.fail(name, value, allowed)
        return value

    def optional_integer(self, name: str, default: int | None) -> int | None:
        """A positive integer, ``default`` when absent, None when null."""
        if name in self.data and self.data[name] is None:
            return None
        return self.integer(name, default)

    def number(self, name: str, default: Any = _REQUIRED, positive: bool = False) -> Any:
        value = self._given(name, default, "a number")
        if value is not default and not is_finite_number(value):
            raise self.fail(name, value, "a number")
        if positive and value is not default and not value > 0:
            raise self.fail(name, value, "a number > 0")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self._given(name, default, "true or false")
        if not isinstance(value, bool):
            raise self.fail(name, value, "true or false")
        return value

    def string(self, name: str, default: Any = _REQUIRED) -> Any:
        value = self._given(name, default, "a string")
        if value is not default and not isinstance(value, str):
            raise self.fail(name, value, "a string")
        return value

    def mapping(self, name: str) -> ConfigFields | None:
        """A nested object, its fields named ``name.field`` in errors; None when absent or null."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, value, "an object")
        return ConfigFields(value, self.source, f"{self.prefix}{name}.")

    def strings(self, name: str) -> list[str] | None:
        value = self.data.get(name)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise self.fail(name, value, "a list of strings")
        return value

    def integers(self, name: str, minimum: int = 0) -> list[int] | None:
        """A list of integers >= ``minimum`` (token or layer ids); None when absent or null."""
        value = self.data.get(name)
        if value is not None and not (
            isinstance(value, list) and all(is_int64(v) and v >= minimum for v in value)
        ):
            raise self.fail(name, value, f"a list of integers >= {minimum}")
        return value
