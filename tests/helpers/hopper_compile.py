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

# What every script starts with: os, subprocess, sys, torch and triton imported, ``compile_for_hopper`` (Triton's
# default warps and stages unless given), ``ptxas_report`` (ptxas -v's report on the PTX for sm_90a:
# registers, spills; its files go into the working directory), ``loop_barriers`` (a loop's bar.sync), and ``launches_of`` + ``compile_as_launched``:
# a launch recorded from the real launch code, compiled as Triton's launcher specializes it.
COMPILE_FOR_HOPPER = '''
import os, subprocess, sys
import torch
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


def loop_barriers(compiled):
    """The ``bar.sync`` instructions in the PTX's first loop (its header block and the blocks LLVM marks
    "in Loop" of that header): what each trip of a kernel's loop meets its warps at; None without a loop."""
    lines = compiled.asm["ptx"].splitlines()
    headers = [l.split("Header=")[1].split()[0] for l in lines if "in Loop: Header=" in l]
    if not headers:
        return None
    header = headers[0]
    count, inside = 0, False
    for i, line in enumerate(lines):
        if line.startswith("$L__BB"):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            inside = line.startswith(f"$L__{header}:") or f"in Loop: Header={header}" in following
        count += inside and "bar.sync" in line
    return count


TRITON_TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1",
                torch.float8_e4m3fn: "*fp8e4nv"}


class Recorder:
    """Stands for a kernel: records each launch's arguments, launches nothing."""
    def __init__(self):
        self.launches = []
    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def launches_of(module, names, run):
    """{kernel name: [(args, keywords), ...]} of the kernels ``names`` of ``module`` that ``run()`` launches
    (launch code running on CPU tensors of the real shapes, the kernels replaced by recorders)."""
    kernels = {n: getattr(module, n) for n in names}
    recorders = {n: Recorder() for n in names}
    for n in names:
        setattr(module, n, recorders[n])
    try:
        run()
    finally:
        for n in names:
            setattr(module, n, kernels[n])
    return {n: r.launches for n, r in recorders.items()}


def compile_as_launched(kernel, args, kwargs):
    """The kernel compiled for sm_90 as Triton's launcher specializes these arguments: an int of 1 a constant,
    ints that are multiples of 16 and tensors at 16-byte addresses marked so (unless not specialized)."""
    constants = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages", "launch_pdl")}
    signature, attrs = {}, {}
    for i, (param, arg) in enumerate(zip(kernel.params, args)):
        name, specialize = kernel.arg_names[i], not param.do_not_specialize
        if isinstance(arg, torch.Tensor):
            signature[name], aligned = TRITON_TYPES[arg.dtype], arg.data_ptr() % 16 == 0
        elif isinstance(arg, float):
            signature[name], aligned = "fp32", False
        elif arg == 1 and specialize:
            constants[name] = 1
            continue
        else:
            signature[name], aligned = "i32", arg % 16 == 0
        if aligned and specialize:
            attrs[(i,)] = [["tt.divisibility", 16]]
    signature.update({n: "constexpr" for n in constants})
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    # (Triton's defaults where the launch gives none)
    options = dict(num_warps=kwargs.get("num_warps", 4), num_stages=kwargs.get("num_stages", 3))
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
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
