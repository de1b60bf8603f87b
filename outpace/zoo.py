"""Where the model zoo (the models outpace trains and ships: zoo/README.md) lies on this machine.

In a clone of the repository it is ``zoo/`` beside the package; a non-editable install carries a copy
inside the package (``outpace/zoo``: setup.py); ``OUTPACE_ZOO`` overrides both.
"""
from __future__ import annotations

import os
from pathlib import Path

ZOO_ENV = "OUTPACE_ZOO"
TARGET = "tinypy"
DRAFTS = {"eagle3": "tinypy-eagle3", "draft": "tinypy-draft", "dflash": "tinypy-dflash"}  # method -> zoo name


def zoo_dir() -> Path:
    """The zoo folder. Raises FileNotFoundError, saying how to point at one, when there is none."""
    if os.environ.get(ZOO_ENV):
        path = Path(os.environ[ZOO_ENV])
        if not (path / TARGET / "config.json").is_file():
            raise FileNotFoundError(f"{ZOO_ENV}={path} holds no zoo (no {TARGET}/config.json)")
        return path
    package = Path(__file__).resolve().parent
    for path in (package / "zoo", package.parent / "zoo"):  # installed package data; a source checkout
        if (path / TARGET / "config.json").is_file():
            return path
    raise FileNotFoundError(f"the model zoo is not installed with this copy of outpace: set {ZOO_ENV} to a "
                            f"clone's zoo/ folder, or name a model directory")


def default_model() -> Path:
    return zoo_dir() / TARGET


def default_draft(method: str) -> Path | None:
    """The zoo's draft for ``method`` (drafts for the zoo target), None when the zoo has none."""
    return zoo_dir() / DRAFTS[method] if method in DRAFTS else None
