"""CPU threads: how many torch uses, and how its idle threads wait, so speed holds on a shared machine.

Torch's intra-op pool (OpenMP) splits each operation across its threads and waits at a barrier
for all of them. By default it starts one thread per core and its idle threads spin (libgomp spins
about 300 000 times before sleeping). With one other busy process on the machine, some thread of the
pool is always waiting for a core; the others spin at the barrier, holding the cores it needs, so
every operation waits for a scheduler time slice: decode fell from about 200 to 1-3 tokens/s
(transformers' generate too) with 2 threads on 2 cores beside one spinning process.

Two defences, both measured (2 cores here; 8 cores of a 16-core host):
- ``prefer_passive_wait``: idle threads sleep (OMP_WAIT_POLICY=PASSIVE). With 8 threads on 8 cores
  beside one busy process: 54 tokens/s (31M-parameter model) and 33 (120M) instead of 1. It costs
  quiet speed where threads are many and operations small (31M: 52 instead of 105 tokens/s on 8
  quiet cores), hence the second:
- ``choose_num_threads``: one thread per ``PARAMS_PER_THREAD`` parameters, at most the CPUs this
  process may use (its affinity mask and cgroup quota). A small model's operations are too short
  to split: with idle threads sleeping, the 7.6M zoo target and a 31M model decode as fast on one
  thread as on several (and one thread has no barrier: a busy neighbour costs it nothing), while a
  120M model runs 2.6x faster on 8 threads than on one.

An explicit OMP_NUM_THREADS (or OMP_WAIT_POLICY / GOMP_SPINCOUNT) is the user's choice and is kept.
"""

from __future__ import annotations

import math
import os

PARAMS_PER_THREAD = 16_000_000
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def prefer_passive_wait() -> None:
    """Let idle OpenMP threads sleep instead of spin, unless the user chose. Must run before torch
    is imported (libgomp reads it once, when it loads): outpace/__init__.py calls it first."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def cgroup_cpu_limit(path: str = CGROUP_CPU_MAX) -> int | None:
    """CPUs the cgroup v2 quota ("QUOTA PERIOD" in cpu.max) allows, rounded up; None without a quota."""
    try:
        quota, period = open(path).read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def available_cpus(cpu_max: str = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on: its affinity mask (the CPU count where the OS has none: macOS),
    capped by the cgroup quota."""
    cpus = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    limit = cgroup_cpu_limit(cpu_max)
    return cpus if limit is None else min(cpus, limit)


def choose_num_threads(num_params: int, cpus: int) -> int:
    """One thread per PARAMS_PER_THREAD parameters, at least 1, at most ``cpus``."""
    return max(1, min(cpus, num_params // PARAMS_PER_THREAD))


def configure_threads(num_params: int) -> int:
    """Set torch's intra-op threads for a model of ``num_params`` parameters; an explicit
    OMP_NUM_THREADS is kept. Returns the number in use."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    num_threads = choose_num_threads(num_params, available_cpus())
    torch.set_num_threads(num_threads)
    return num_threads
