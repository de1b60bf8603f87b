"""The speculative step's bookkeeping kernels compiled for an H100 / H200 (sm_90) without a GPU, in a process of its
own (tests/helpers/hopper_compile.py), as their launch code launches them: greedy chain verification's result
(speculative/tree_kernels.py ``greedy_chain``) and the MTP windows' update, gathering and layer tokens and a held
step's append (speculative/pending_window_kernel.py, at the widened Qwen3.5's window: 12 rows of 4096). Triton's
interpreter, which runs their other tests on a CPU, checks neither that they compile nor that they keep their
registers (ptxas -v)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402

SM90_COMPILE = """
import torch
from outpace.speculative import pending_window_kernel as pw, tree_kernels as tk

def check(module, name, run):
    for args, kwargs in launches_of(module, (name,), run)[name]:
        report = ptxas_report(compile_as_launched(getattr(module, name), args, kwargs))
        print(name, "0 bytes spill stores" in report)

i64 = dict(dtype=torch.int64)
for drafts in (1, 3):
    check(tk, "_greedy_chain_kernel", lambda: tk.greedy_chain(
        torch.zeros(8, drafts, **i64), torch.zeros(8, drafts + 1, **i64)))
check(pw, "_take_verified_kernel", lambda: pw.take_verified(
    torch.zeros(9, 12, 4096, dtype=torch.bfloat16), torch.zeros(9, 12, **i64), torch.zeros(9, **i64),
    torch.ones(9, **i64), torch.arange(8), torch.zeros(8, **i64), torch.zeros(8, **i64), torch.zeros(8, **i64),
    torch.zeros(8, 3, **i64), torch.zeros(8, 3, **i64), torch.zeros(24, 4096, dtype=torch.bfloat16), 1, 3))
for columns in (12, 4):  # the whole windows and the narrow ones
    check(pw, "_window_kernel", lambda: pw.window(
        torch.zeros(9, 12, 4096, dtype=torch.bfloat16), torch.zeros(9, 12, **i64), torch.zeros(9, **i64),
        torch.ones(9, **i64), torch.arange(8), columns))
for drafts in (0, 2):
    check(pw, "_layer_tokens_kernel", lambda: pw.layer_tokens(
        torch.zeros(8, 12, **i64), torch.ones(8, **i64), torch.zeros(8, drafts, **i64), 1))
for size in (4096, 3 * 4096):  # MTP's held row (the target's state), EAGLE3's (its three aux states)
    check(pw, "_append_kernel", lambda: pw.append(
        torch.zeros(9, 14, size, dtype=torch.bfloat16), torch.zeros(9, 14, **i64), torch.ones(9, **i64),
        torch.arange(8), torch.zeros(8, size, dtype=torch.bfloat16), torch.zeros(8, **i64)))
"""


def test_spec_bookkeeping_kernels_compile_for_sm90(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = ["_greedy_chain_kernel"] * 2 + ["_take_verified_kernel"] + ["_window_kernel"] * 2
    names += ["_layer_tokens_kernel"] * 2 + ["_append_kernel"] * 2
    assert done.stdout.split() == [w for n in names for w in (n, "True")]
