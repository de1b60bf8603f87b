"""Kernels compiled for an H100 / H200 (sm_90) without a GPU: what Triton's interpreter does not check (compile
errors, instructions in the PTX, registers spilled). A test's script runs in a process of its own, where the
interpreter (which tests/conftest.py turns on without a GPU) is off, after ``COMPILE_FOR_HOPPER``: the test
names its kernels, constants and checks, the preamble how to compile them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])  # (the subprocess imports outpace from here)

# What every script starts with: os, subprocess, sys and triton imported, ``compile_for_hopper`` (Triton's
# default warps and stages unless given) and ``ptxas_report`` (ptxas -v's report on the PTX for sm_90a:
# registers, spills; its files go into the working directory).
COMPILE_FOR_HOPPER = '''
import os, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_for_hopper(kernel, types, constants, num_warps=4, num_stages=3, **options):
    """An argument named in constants is that constexpr, else of its type in types ("i32" if absent)."""
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    options = dict(num_warps=num_warps, num_stages=num_stages, **options)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def ptxas_report(compiled):
    open("k.ptx", "w").write(compiled.asm["ptx"])
    done = subprocess.run([PTXAS, "--gpu-name", "sm_90a", "-v", "k.ptx", "-o", "k.cubin"],
                          capture_output=True, text=True, check=True)
    return done.stdout + done.stderr
'''


def run_compile_script(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``COMPILE_FOR_HOPPER`` then ``script`` run by this Python in ``cwd`` with ``args`` as its
    sys.argv[1:], the interpreter off and outpace imported from this checkout; its output captured as
    text. Skips the test where Triton has no ptxas (its NVIDIA backend)."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("Triton without its NVIDIA backend's ptxas")
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_HOPPER + script, *args],
        cwd=cwd,
        env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path},
        capture_output=True,
        text=True,
    )
