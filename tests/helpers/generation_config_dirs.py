"""A copy of the zoo target (zoo/tinypy, its files linked) with a generation_config.json of the test's own: the
sampling defaults of outpace/generation_defaults.py."""

from __future__ import annotations

import json
from pathlib import Path

TINYPY = Path(__file__).resolve().parents[2] / "zoo" / "tinypy"


def tinypy_with_generation_config(folder: Path, fields: dict) -> str:
    """``folder`` (created) holding zoo/tinypy's files and a generation_config.json of ``fields``; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in TINYPY.iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "generation_config.json").write_text(json.dumps(fields))
    return str(folder)
