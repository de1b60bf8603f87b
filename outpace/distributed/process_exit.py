"""How a rank's process leaves: without the interpreter's teardown, whose C++ destructors aborted ranks on gloo
at exit. Imports no torch: the CLI asks ``launched_by_torchrun`` before any command loads it."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_then_leave(command: Callable[[], object]) -> NoReturn:
    """Run ``command``, then ``leave_process`` with the exit code the interpreter would give and its report on
    stderr: 0 when it returns; a ``SystemExit``'s code (its message printed and 1, when it carries one); the
    traceback and 1 for any other exception (128 + SIGINT for a KeyboardInterrupt, as a shell reports the
    interpreter's death by it). The command must close what it opens (the engine and its ranks, the files it
    writes): after it only the log handlers and the streams are flushed."""
    try:
        command()
        code = 0
    except SystemExit as e:
        code = system_exit_code(e)
    except BaseException as e:  # noqa: BLE001 - reported as the interpreter reports it, then the exit
        sys.excepthook(type(e), e, e.__traceback__)
        code = 128 + signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    leave_process(code)


def system_exit_code(e: SystemExit) -> int:
    """The exit code the interpreter gives an uncaught ``e`` (a code that is not an int is printed, then 1)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def leave_process(code: int) -> NoReturn:
    """Exit with ``code`` as a multiprocessing child leaves (the ranks outpace starts itself, launch.py
    ``_rank_main``): log handlers and streams flushed, then ``os._exit``, without the interpreter's teardown
    (atexit hooks, finalizers, gloo's C++ destructors). That teardown, after an orderly close, aborted
    torchrun-started ranks on gloo ("terminate called without an active exception", SIGABRT, exit -6) under
    CI's load: a follower once in tests/distributed/test_expert_parallel_nodes.py's server test (which left
    rank 0's torchrun waiting on the failed node) and the driver once in its generate test, after it had
    printed every token."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
