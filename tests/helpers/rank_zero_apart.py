"""``train_on_ranks`` with its rank 0 in a spawned process of its own rather than in the pytest worker.

In the worker, rank 0 shares the worker's process: once in CI (2026-12-06) the process aborted while rank 0 was
in gloo's all_reduce ("Fatal Python error: Aborted", test_train_ranks.py's standalone draft; the cause unknown),
the worker died, its stderr (captured by pytest) with it, and xdist then hung the whole run at 97%. Apart, such an
abort fails the one test, with the process's exit status and its stderr.

It aborted again in CI on 2026-12-07 ("malloc(): unaligned tcache chunk detected" in rank 0 during the MTP recipe's
run, exit status -6; the same test passed three times alone right after; cause still unknown). A rank 0 killed by
a signal, with no result, is therefore run once more, with a warning that names the first death; a second death,
or any result that is wrong or an exception, fails the test as before."""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from pathlib import Path

import torch.multiprocessing as mp

from outpace.train.ranks import train_on_ranks

TIMEOUT_S = 900.0  # a two-rank toy run takes seconds to a minute on a busy CPU


def train_on_ranks_apart(fn, nproc: int, device: str, *args):
    """``train_on_ranks(fn, nproc, device, *args)`` run in a spawned process: its result, or the exception it
    raised, raised again here; a process that dies without either (a signal, an abort) is run once more (module
    docstring), and fails the second time with its exit status and the end of its stderr."""
    try:
        return _run_apart(fn, nproc, device, args)
    except _Died as death:
        warnings.warn(f"rank 0 died without a result, run again: {death}", stacklevel=2)
        return _run_apart(fn, nproc, device, args)


class _Died(AssertionError):
    """Rank 0's process ended by a signal without a result."""


def _run_apart(fn, nproc: int, device: str, args: tuple):
    with tempfile.TemporaryDirectory() as scratch:
        outcome, stderr = Path(scratch) / "outcome.pkl", Path(scratch) / "stderr.log"
        process = mp.get_context("spawn").Process(
            target=_rank_zero, args=(fn, nproc, device, args, str(outcome), str(stderr))
        )
        process.start()
        process.join(TIMEOUT_S)
        status = process.exitcode  # None: still running past TIMEOUT_S
        if status is None:
            process.kill()
            process.join()
        if not outcome.exists():
            tail = stderr.read_text(errors="replace")[-4000:] if stderr.exists() else ""
            raise (_Died if status is not None and status < 0 else AssertionError)(
                f"rank 0 of {nproc} ended without a result (exit status {status}; None: past "
                f"{TIMEOUT_S:.0f} s); its stderr ends:\n{tail}"
            )
        kind, value = pickle.loads(outcome.read_bytes())
    if kind == "raised":
        raise value
    return value


def _rank_zero(fn, nproc: int, device: str, args: tuple, outcome: str, stderr: str) -> None:
    """The spawned process: its stderr (C++'s too) into ``stderr``; ("returned", result) or ("raised",
    exception) pickled into ``outcome``."""
    with open(stderr, "w") as log:
        os.dup2(log.fileno(), 2)
    try:
        result = ("returned", train_on_ranks(fn, nproc, device, *args))
    except Exception as e:  # noqa: BLE001 - raised again in the test's process
        result = ("raised", e)
    try:
        pickled = pickle.dumps(result)
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its type and text
        pickled = pickle.dumps(("raised", RuntimeError(f"{type(result[1]).__name__}: {result[1]}")))
    Path(outcome).write_bytes(pickled)
