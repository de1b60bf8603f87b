"""A script of benchmarks/scripts imported as a module, so that tests can check what it would run on a device."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "scripts"


def load_bench_script(name: str) -> ModuleType:
    """benchmarks/scripts/``name``.py, executed afresh as the module ``name`` (entered in sys.modules: a
    dataclass of the script looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
