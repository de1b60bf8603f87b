"""layers/l2_prefetch.py without a GPU: the fork and join around the prefetches (streams stood in for by
recorders), which tensors are asked for, and the kernel compiled for an H100 / H200 (sm_90) with the bulk
prefetch instruction. tests/gpu/test_l2_prefetch_gpu.py runs it inside captured decode steps."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from outpace.layers import l2_prefetch
from outpace.layers.quant.fp8_weight import Fp8Weight

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402


class _Stream:
    def __init__(self, name: str, events: list) -> None:
        self.name, self.events = name, events

    def wait_stream(self, other: _Stream) -> None:
        self.events.append(f"{self.name} waits for {other.name}")


@pytest.fixture
def events(monkeypatch) -> list:
    """What the prefetches do, in order: streams waiting, and spans asked for (on the stream current then)."""
    from outpace.layers import l2_prefetch_kernel

    events: list = []
    main, side = _Stream("main", events), _Stream("side", events)
    current = [main]

    @contextmanager
    def on(stream):
        current.append(stream)
        yield
        current.pop()

    monkeypatch.setattr(l2_prefetch, "_supported", lambda device: True)
    monkeypatch.setattr(l2_prefetch, "_side_stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(
        l2_prefetch_kernel,
        "prefetch_span",
        lambda t, fraction: events.append(
            (current[-1].name, t.data_ptr(), t.numel() * t.element_size() * fraction)
        ),
    )
    monkeypatch.setattr(l2_prefetch, "enabled", True)
    return events


def test_prefetches_fork_after_the_queued_work_and_join_at_the_blocks_end(events):
    a, b = torch.empty(64, 32, dtype=torch.bfloat16), torch.empty(128, dtype=torch.float32)
    with l2_prefetch.prefetching(torch.device("cuda")):
        l2_prefetch.issue(a)
        l2_prefetch.issue(b, None)
        assert events[-1] != "main waits for side"
    assert events == [
        "side waits for main",
        ("side", a.data_ptr(), 4096),
        "side waits for main",
        ("side", b.data_ptr(), 512),
        "main waits for side",
    ]


def test_a_quantized_weight_brings_its_scales_and_an_unfit_span_is_left_out(events):
    weight = Fp8Weight(
        torch.empty(256, 256, dtype=torch.float8_e4m3fn), torch.empty(2, 2), (128, 128)
    )
    strided = torch.empty(64, 64, dtype=torch.bfloat16)[:, :32]
    with l2_prefetch.prefetching(torch.device("cuda")):
        l2_prefetch.issue(weight, strided)
    spans = [e for e in events if isinstance(e, tuple)]
    assert spans == [
        ("side", weight.weight.data_ptr(), 65536),
        ("side", weight.scale.data_ptr(), 16),
    ]


def test_nothing_is_asked_outside_a_block_nor_when_off(events, monkeypatch):
    l2_prefetch.issue(torch.empty(64))
    monkeypatch.setattr(l2_prefetch, "enabled", False)
    with l2_prefetch.prefetching(torch.device("cuda")):
        l2_prefetch.issue(torch.empty(64))
    with l2_prefetch.prefetching(torch.device("cuda")):  # a block that issued nothing joins nothing
        pass
    assert events == []


SM90_COMPILE = """
from outpace.layers import l2_prefetch_kernel as k

compiled = compile_for_hopper(
    k._prefetch_kernel, {"ptr": "*u8", "nbytes": "i64"}, {"CHUNK": k.CHUNK_BYTES, "CHUNKS": 128}
)
ptx = compiled.asm["ptx"]
print("bulk prefetches:", ptx.count("cp.async.bulk.prefetch.L2.global"))
print(ptxas_report(compiled))
"""


def test_the_kernel_compiles_for_hopper_to_bulk_prefetches(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "bulk prefetches: 1" in done.stdout
