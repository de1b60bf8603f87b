"""Every test that needs a CUDA device carries the ``gpu`` marker (tests/conftest.py skips it without one), so that
``pytest -m gpu`` selects every GPU test. A test skipped by its own condition on CUDA's absence ran only when its
file was named on a GPU: ``tests/kernels/test_mla_fused.py``'s engine-capture test failed on the H200 unnoticed
that way (benchmarks/results/gpu_2026-12-03f, call 3)."""

from __future__ import annotations

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
