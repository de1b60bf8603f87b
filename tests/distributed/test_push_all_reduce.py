"""distributed/push_all_reduce_kernel.py under Triton's interpreter, one process playing every rank
(tests/helpers/push_ranks.py). On two GPUs: tests/gpu/test_gpu_symmetric_all_reduce.py."""

from __future__ import annotations

import os

import pytest
import torch

from helpers.hopper_compile import run_compile_script
from helpers.push_ranks import PushRanks
from outpace.distributed.push_all_reduce_kernel import BLOCK, push_all_reduce_

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter plays every rank on the CPU"
)


def _all_reduce(ranks: PushRanks, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    outs = [x.clone() for x in xs]

    def run(r: int) -> torch.Tensor:
        return push_all_reduce_(outs[r], ranks.group(r).symmetric)

    return ranks.call(xs, run)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("n", [1, 2048, 2 * BLOCK + 37])
def test_every_rank_gets_the_rank_order_float32_sum_bit_for_bit(world, n):
    ranks = PushRanks(world, torch.float32)
    g = torch.Generator().manual_seed(world * 100 + n)
    for call in range(3):  # the buffers' two phases, then the first again
        xs = [torch.randn(n, generator=g) * 10 ** (r - 1) for r in range(world)]
        xs[0][0] = -0.0  # a value that is the empty slot's bits: sent as +0.0
        if n > 1:
            for x in xs:
                x[n - 1] = -0.0
        outs = _all_reduce(ranks, xs)
        expected = xs[0].clone()
        for x in xs[1:]:
            expected = expected + x  # rank order, float32
        for r, out in enumerate(outs):
            assert torch.equal(out, expected), (world, n, call, r)
            assert not torch.signbit(out[-1]) or n == 1
        assert [int(e) for e in ranks.epochs] == [call + 1] * world


def test_bf16_messages_travel_in_their_bits():
    """bf16 sums of exactly representable values (the interpreter's float32 -> bf16 conversion truncates
    where the GPU rounds, so the values are chosen to need neither)."""
    ranks = PushRanks(2, torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    n = BLOCK + 5
    for _ in range(2):
        xs = [(torch.randint(-64, 64, (n,), generator=g) / 4).to(torch.bfloat16) for _ in range(2)]
        xs[1][3] = -0.0
        outs = _all_reduce(ranks, xs)
        expected = (xs[0].float() + xs[1].float()).to(torch.bfloat16)
        assert torch.equal(outs[0], expected) and torch.equal(outs[1], expected)


def test_consecutive_calls_use_the_other_buffer():
    """Call k writes the peers' slots of buffer k % 2: a rank ahead by one call never overwrites a slot its
    slower peer has yet to read (kernel docstring)."""
    ranks = PushRanks(2, torch.float32)
    x = torch.arange(1.0, 9.0)
    ranks.buffers[0][0, 1, :8] = x.view(torch.int32)  # rank 1's push for call 0
    for call in range(2):
        out = x.clone()
        push_all_reduce_(out, ranks.group(0).symmetric)  # rank 0 alone
        phase = call % 2
        assert torch.equal(ranks.buffers[1][phase, 0, :8], x.view(torch.int32))
        assert (ranks.buffers[1][1 - phase, 0] == ranks.empty).all()
        ranks.buffers[1][phase, 0].fill_(ranks.empty)
        ranks.buffers[0][1 - phase, 1, :8] = x.view(torch.int32)  # rank 1's push for the next call


SM90_COMPILE = """
from outpace.distributed.push_all_reduce_kernel import _push_all_reduce_kernel as kernel
for world, bits, x, empty in ((2, "*i16", "*bf16", -(1 << 15)), (8, "*i32", "*fp32", -(1 << 31))):
    types = dict(x_ptr=x, out_ptr=x, buffers_ptr="*i64", epoch_ptr="*i32", arrivals_ptr="*i32")
    constants = dict(BITS_TY=getattr(triton.language, bits[1:].replace("i", "int")), EMPTY=empty, RANK=1,
                     WORLD=world, BLOCK=1024)
    ptx = compile_for_hopper(kernel, types, constants, num_warps=4, num_stages=1).asm["ptx"]
    print(world, ptx.count("ld.volatile.global"), "atom.global" in ptx)
"""


def test_the_kernel_compiles_for_hopper_and_spins_on_volatile_loads(tmp_path):
    """Under the interpreter every load is fresh; compiled, the wait must read memory again each turn: a
    volatile load for the first look at each peer's slot and one in the loop."""
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [r[0] for r in rows] == ["2", "8"]
    for world, volatile_loads, atomic in rows:
        assert int(volatile_loads) >= 2 * (int(world) - 1) and atomic == "True", rows
