"""The small all-reduces of decoding over symmetric memory: one kernel in which each rank reads its peers'
buffers over NVLink (torch's ``symm_mem.one_shot_all_reduce``), in place of NCCL's for messages up to
``MAX_BYTES``.

A decode or verify step all-reduces [tokens, hidden] activations a few times a layer (layers/linear.py,
layers/moe.py). Those are a few kilobytes to a few hundred, where NCCL's latency is the whole cost: on two
H200s with NVLink multicast off, 90 captured all-reduces of [1, 4096] bf16 took 21.1 us each by NCCL and
7.1 us by the one-shot kernel, [32, 4096] 19.0 against 9.4 us, with sums equal to NCCL's
(benchmarks/scripts/all_reduce_timings.py, benchmarks/results/gpu_2026-11-29e call 3). vLLM and SGLang keep
such a path beside NCCL for the same reason (their custom and symmetric-memory all-reduces).

Each rank's kernel copies its tensor into its own slice of the shared buffer, waits for every rank's
copy, sums the ranks' slices in rank order (so every rank gets the same bits, whatever the message's
size: batch-invariant where NCCL's algorithm changes with the size) and waits again before any rank may
overwrite its buffer: torch's ``symm_mem.one_shot_all_reduce_copy_out``, one launch (a copy into the buffer
and then ``one_shot_all_reduce_out`` took two: on two H200s the copy's launch cost 1.0 us and a 0.4 us gap
before each of Qwen3-Next-80B's 97 all-reduces a step, benchmarks/results/gpu_2026-11-30h call 1's
timeline). It runs inside captured CUDA graphs like any kernel.

It is set up once per process group, when the group starts, by every rank together (the rendezvous that
maps the peers' buffers is a collective, so it cannot happen lazily inside a graph capture); it is used only
where every rank of the group is on one machine (peer memory needs NVLink or PCIe peers) and every rank's set-up
succeeded, and only for float32 and bfloat16 tensors whose bytes are a multiple of 16 (the kernel's vector
width). Everything else goes to NCCL.
"""

from __future__ import annotations

import socket
import warnings

import torch
import torch.distributed as dist

# Largest message the one-shot kernel takes: decode and verify activations (32 rows of a 7168-wide hidden
# in bf16 are 458 KB); prefill chunks are larger and go to NCCL, which moves bulk faster.
MAX_BYTES = 1 << 19
_DTYPES = (
    torch.bfloat16,
    torch.float32,
)  # what torch's symmetric-memory reduction kernels dispatch on
_ALIGN = 16


class SymmetricAllReduce:
    """One process group's staging buffer in symmetric memory and the one-shot all-reduce over it."""

    def __init__(self, buffer: torch.Tensor, group_name: str, kernel) -> None:
        self.buffer = buffer  # [MAX_BYTES] uint8 in symmetric memory, rendezvoused over the group
        self.group_name = group_name
        self.kernel = kernel  # torch.ops.symm_mem.one_shot_all_reduce_copy_out

    @classmethod
    def for_group(cls, device_group, cpu_group, device: torch.device) -> SymmetricAllReduce | None:
        """Set up over ``device_group`` (NCCL) by every rank at once; None on every rank where any rank is on
        another machine or any rank's set-up failed (module docstring), agreed over ``cpu_group`` (gloo)."""
        hosts = [None] * dist.get_world_size(cpu_group)
        dist.all_gather_object(hosts, socket.gethostname(), group=cpu_group)
        if len(set(hosts)) > 1:
            return None
        made, error = None, None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            # (a torch without it: NCCL only)
            kernel = torch.ops.symm_mem.one_shot_all_reduce_copy_out
            buffer = symm_mem.empty(MAX_BYTES, dtype=torch.uint8, device=device)
            symm_mem.rendezvous(buffer, device_group.group_name)
            made = cls(buffer, device_group.group_name, kernel)
        except (ImportError, RuntimeError, AttributeError) as e:
            error = f"{type(e).__name__}: {e}"
        errors = [None] * dist.get_world_size(cpu_group)
        dist.all_gather_object(errors, error, group=cpu_group)
        if any(errors):
            warnings.warn(
                "symmetric-memory all-reduce unavailable, decoding's all-reduces use NCCL: "
                + "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e),
                stacklevel=2,
            )
            return None
        return made

    def takes(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        return (
            x.dtype in _DTYPES
            and x.is_contiguous()
            and nbytes <= MAX_BYTES
            and nbytes % _ALIGN == 0
        )

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (``takes(x)``) replaced by its sum over the group's ranks; returns ``x``. (The kernel reads
        all of x into the buffer before any rank writes a sum: x may be the output.)"""
        flat = x.view(-1)
        staged = self.buffer[: flat.numel() * x.element_size()].view(x.dtype)  # [numel]
        self.kernel(staged, flat, "sum", self.group_name, flat)
        return x
