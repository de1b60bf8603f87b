"""GPU tests that CI cannot run stay sound. Every test that needs a CUDA device carries the ``gpu`` marker
(tests/conftest.py skips it without one), so that ``pytest -m gpu`` selects every GPU test. A test skipped by its
own condition on CUDA's absence ran only when its file was named on a GPU: ``tests/kernels/test_mla_fused.py``'s
engine-capture test failed on the H200 unnoticed that way (benchmarks/results/gpu_2026-12-03f, call 3)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# a skip on CUDA's absence, as the test files wrote it
CUDA_ABSENT = re.compile(
    r"skipif\(\s*(not CUDA|not torch\.cuda\.is_available\(\)|DEVICE != \"cuda\"|not HAS_CUDA)"
)


def test_gpu_tests_are_marked_gpu_not_skipped_by_hand():
    found = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if CUDA_ABSENT.search(line)
    ]
    assert not found, f"mark these tests @pytest.mark.gpu instead: {found}"


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> outpace module, for ``import outpace.x as y`` and ``from outpace.x import y`` of a module
    (anywhere in the file: the tests import Triton's modules inside GPU tests)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("outpace.") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("outpace"):
            for a in node.names:
                name = f"{node.module}.{a.name}"
                if importlib.util.find_spec(node.module) and _is_module(name):
                    aliases[a.asname or a.name] = name
    return aliases


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_gpu_tests_name_attributes_that_exist():
    """A GPU test that reaches into a module (``kernels.grouped_experts``, a monkeypatch of it) by a name that a
    move took away fails only on a GPU: both MoE tests that patched ``layers/moe_kernels.grouped_experts``
    failed on the H100 (benchmarks/results/gpu_2026-12-05f, call 16) after 3511e08 moved it. Here, on any
    machine: every ``alias.name`` of an imported outpace module names an attribute the module has."""
    missing = []
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        if "mark.gpu" not in text:  # (the CPU run checks the others by running them)
            continue
        tree = ast.parse(text)
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                module = importlib.import_module(aliases[node.value.id])
                if not hasattr(module, node.attr) and not _is_module(
                    f"{module.__name__}.{node.attr}"
                ):
                    missing.append(
                        f"{path.relative_to(TESTS)}:{node.lineno} {module.__name__}.{node.attr}"
                    )
            elif (  # monkeypatch.setattr(alias, "name", ...)
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr"
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in aliases
                and isinstance(node.args[1], ast.Constant)
            ):
                module = importlib.import_module(aliases[node.args[0].id])
                if not hasattr(module, node.args[1].value):
                    missing.append(
                        f"{path.relative_to(TESTS)}:{node.lineno} {module.__name__}.{node.args[1].value}"
                    )
    assert not missing, f"names no module has: {missing}"
