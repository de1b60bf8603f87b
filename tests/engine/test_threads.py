"""The CPU thread choice (outpace/threads.py): from the affinity mask and the cgroup quota; an
explicit user setting is kept."""

import os

import pytest
import torch

from outpace import threads
from outpace.threads import (
    PARAMS_PER_THREAD,
    available_cpus,
    cgroup_cpu_limit,
    choose_num_threads,
    configure_threads,
)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _cpu_max(tmp_path, text: str) -> str:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    return str(path)


def test_cgroup_quota(tmp_path):
    assert cgroup_cpu_limit(_cpu_max(tmp_path, "max 100000\n")) is None
    assert cgroup_cpu_limit(_cpu_max(tmp_path, "200000 100000\n")) == 2
    assert cgroup_cpu_limit(_cpu_max(tmp_path, "150000 100000\n")) == 2  # 1.5 CPUs: rounded up
    assert cgroup_cpu_limit(_cpu_max(tmp_path, "5000 100000\n")) == 1
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None


def test_available_cpus_is_affinity_capped_by_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert available_cpus(str(tmp_path / "absent")) == 8
    assert available_cpus(_cpu_max(tmp_path, "max 100000")) == 8
    assert available_cpus(_cpu_max(tmp_path, "300000 100000")) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5})
    assert available_cpus(_cpu_max(tmp_path, "400000 100000")) == 2


def test_thread_count_grows_with_the_model_up_to_the_cpus():
    assert choose_num_threads(7_600_000, 16) == 1  # the zoo target: one thread
    assert choose_num_threads(0, 16) == 1
    assert choose_num_threads(4 * PARAMS_PER_THREAD, 16) == 4
    assert choose_num_threads(100 * PARAMS_PER_THREAD, 16) == 16
    assert choose_num_threads(100 * PARAMS_PER_THREAD, 2) == 2


def test_configure_threads_uses_the_cpus_it_may_use(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 3)
    assert configure_threads(100 * PARAMS_PER_THREAD) == 3 == torch.get_num_threads()
    assert configure_threads(7_600_000) == 1 == torch.get_num_threads()


def test_explicit_omp_num_threads_is_kept(monkeypatch, restore_threads):
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(threads, "available_cpus", lambda: 1)
    assert configure_threads(7_600_000) == 2 == torch.get_num_threads()


def test_wait_policy_is_passive_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    threads.prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    threads.prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    threads.prefer_passive_wait()
    assert "OMP_WAIT_POLICY" not in os.environ


def test_engine_sets_the_threads_at_start(monkeypatch, restore_threads):
    from pathlib import Path

    from outpace import LLM

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    LLM(str(Path(__file__).resolve().parents[2] / "zoo" / "tinypy"), device="cpu")
    assert torch.get_num_threads() == 1  # 7.6M parameters: one thread
