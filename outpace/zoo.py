"""Where the model zoo (the models outpace trains and ships: zoo/README.md) lies on this machine.

In a clone of the repository it is ``zoo/`` beside the package; a non-editable install carries a copy
inside the package (``outpace/zoo``: setup.py); ``OUTPACE_ZOO`` overrides both. A zoo model's draft
for a method sits beside it as ``<model>-<method>`` (tinypy-eagle3, tinypy-dflash, tinypy-draft).
"""

from __future__ import annotations

import os
from pathlib import Path

ZOO_ENV = "OUTPACE_ZOO"
TARGET = "tinypy"
DEFAULT_METHOD = "eagle3"  # the drafter the zoo target runs with when none is named


def zoo_dir() -> Path:
    """The zoo folder. Raises FileNotFoundError, saying how to point at one, when there is none."""
    if os.environ.get(ZOO_ENV):
        path = Path(os.environ[ZOO_ENV])
        if not (path / TARGET / "config.json").is_file():
            raise FileNotFoundError(f"{ZOO_ENV}={path} holds no zoo (no {TARGET}/config.json)")
        return path
    package = Path(__file__).resolve().parent
    for path in (
        package / "zoo",
        package.parent / "zoo",
    ):  # installed package data; a source checkout
        if (path / TARGET / "config.json").is_file():
            return path
    raise FileNotFoundError(
        f"the model zoo is not installed with this copy of outpace: set {ZOO_ENV} to a "
        f"clone's zoo/ folder, or name a model directory"
    )


def default_model() -> Path:
    return zoo_dir() / TARGET


def is_default_model(model: str | Path) -> bool:
    """Whether ``model`` is the zoo target (False when there is no zoo)."""
    try:
        return Path(model).resolve() == default_model().resolve()
    except FileNotFoundError:
        return False


def default_draft(method: str, model: str | Path | None = None) -> Path | None:
    """The zoo's draft for ``method`` on the zoo model ``model`` (default: the zoo target), None when
    ``model`` is not a zoo model or the zoo has no such draft."""
    try:
        zoo = zoo_dir().resolve()
    except FileNotFoundError:
        return None
    model = Path(model).resolve() if model is not None else zoo / TARGET
    draft = zoo / f"{model.name}-{method}"
    return draft if model.parent == zoo and (draft / "config.json").is_file() else None
