"""On two GPUs: the symmetric-memory all-reduce (distributed/symmetric_all_reduce.py) set up as the engine's
groups set it up (``init_rank_group``) gives every rank NCCL's sum, eagerly and replayed in a CUDA graph, at
decoding's sizes in bf16 and float32, and over many replays of a graph of several calls with eager calls
between; the all-reduce fused with the residual add and the next RMSNorm (layers/all_reduce_norm.py) against
the two launches; a prefill-sized message goes to NCCL."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
    ),
]


def _rank(rank: int, port: int, failures) -> None:
    import torch.distributed as dist

    from outpace.distributed.collectives import all_reduce
    from outpace.distributed.group import init_rank_group
    from outpace.layers.all_reduce_norm import all_reduce_add_rms_norm
    from outpace.layers.norm import Float32RMSNorm, RMSNorm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = init_rank_group(2, rank, "cuda")
    try:
        assert group.symmetric is not None, "no symmetric-memory path on one machine's two GPUs"
        for dtype in (torch.bfloat16, torch.float32):
            for rows in (1, 8, 32):
                g = torch.Generator("cuda").manual_seed(rank * 10 + rows)
                x = torch.randn(rows, 2048, device="cuda", generator=g).to(dtype)
                assert group.symmetric.takes(x)
                expected = x.clone()
                dist.all_reduce(expected)
                eager = all_reduce(x.clone(), group)
                assert torch.equal(eager, expected), (dtype, rows, "eager")
                staged = x.clone()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    all_reduce(staged, group)
                staged.copy_(x)
                graph.replay()
                torch.cuda.synchronize()
                assert torch.equal(staged, expected), (dtype, rows, "graph")
        # an odd number of calls a graph, replayed again and again: consecutive calls alternate buffers
        # across replays too (the epoch counts on the device), and no rank overtakes another's reads
        g = torch.Generator("cuda").manual_seed(100 + rank)
        xs = [
            torch.randn(r, 4096, device="cuda", generator=g).to(torch.bfloat16)
            for r in (1, 32, 8, 1, 3, 32, 1)
        ]
        sums = []
        for x in xs:
            sums.append(x.clone())
            dist.all_reduce(sums[-1])
        works = [x.clone() for x in xs]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for w in works:
                all_reduce(w, group)
        for replay in range(20):
            for w, x in zip(works, xs):
                w.copy_(x)
            graph.replay()
            eager = all_reduce(xs[replay % len(xs)].clone(), group)  # an eager call between replays
            torch.cuda.synchronize()
            for i, (w, s) in enumerate(zip(works, sums)):
                assert torch.equal(w, s), ("replay", replay, i)
            assert torch.equal(eager, sums[replay % len(xs)]), ("eager between replays", replay)
        # the all-reduce fused with the residual add and the next RMSNorm: the bits of the two launches
        with torch.no_grad():  # (the norm modules take their Triton kernels without autograd)
            for norm in (RMSNorm(2048).cuda(), Float32RMSNorm(2048, 1e-6, 1.0).cuda()):
                for rows in (1, 8, 32):
                    x = torch.randn(rows, 2048, device="cuda", generator=g).to(torch.bfloat16)
                    stream = torch.randn(rows, 2048, device="cuda").to(torch.bfloat16)
                    expected = norm(all_reduce(x.clone(), group), stream)
                    fused = all_reduce_add_rms_norm(x, stream, norm, group)
                    assert fused is not None, (
                        "the fused kernel did not take a decode-sized bf16 call"
                    )
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        replayed = all_reduce_add_rms_norm(x, stream, norm, group)
                    graph.replay()
                    torch.cuda.synchronize()
                    for got, what in ((fused, "eager"), (replayed, "graph")):
                        assert torch.equal(got[0], expected[0]), (
                            type(norm).__name__,
                            rows,
                            what,
                            "norm",
                        )
                        assert torch.equal(got[1], expected[1]), (
                            type(norm).__name__,
                            rows,
                            what,
                            "stream",
                        )
        big = torch.full((256, 2048), float(rank + 1), device="cuda")
        assert not group.symmetric.takes(big)
        assert torch.equal(all_reduce(big, group), torch.full_like(big, 3.0))
    except AssertionError as e:
        failures.put(f"rank {rank}: {e}")
    finally:
        dist.destroy_process_group()


def test_symmetric_all_reduce_equals_nccl_on_two_gpus():
    from outpace.distributed.launch import free_port

    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, failures)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p in procs:
        if p.is_alive():  # (a rank waiting forever for a peer's data)
            p.kill()
    for p in procs:
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    assert failures.empty(), failures.get()
