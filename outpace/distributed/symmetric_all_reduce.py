"""The small all-reduces of decoding over symmetric memory: one kernel in which each rank writes its tensor
into its peers' buffers over NVLink and sums what its own buffer receives (distributed/push_all_reduce_kernel.py),
in place of NCCL's for messages up to ``MAX_BYTES``.

A decode or verify step all-reduces [tokens, hidden] activations a few times a layer (layers/linear.py,
layers/moe.py). Those are a few kilobytes to a few hundred, where NCCL's latency is the whole cost: on two
H200s with NVLink multicast off, 90 captured all-reduces of [1, 4096] bf16 took 3.52 us each by the push
kernel, 7.07 by torch's barrier-based one-shot kernel (``symm_mem.one_shot_all_reduce``) and 17.52 by NCCL;
[32, 4096] 4.52 / 9.28 / 20.12 us, the sums equal to NCCL's (benchmarks/scripts/all_reduce_timings.py,
benchmarks/results/gpu_2026-12-01 call 1). The kernel sums the ranks in rank order, so every rank gets the same
bits whatever the message's size (batch-invariant where NCCL's algorithm changes with the size). vLLM and
SGLang keep such a path beside NCCL for the same reason (their custom and symmetric-memory all-reduces). It
runs inside captured CUDA graphs like any kernel; layers/all_reduce_norm.py fuses it with the residual add
and the next RMSNorm.

It is set up once per process group, when the group starts, by every rank together (the rendezvous that
maps the peers' buffers is a collective, so it cannot happen lazily inside a graph capture); it is used only
where every rank of the group is on one machine (peer memory needs NVLink or PCIe peers) and every rank's set-up
succeeded, and only for contiguous float32 and bfloat16 tensors. Everything else goes to NCCL.
"""

from __future__ import annotations

import socket
import warnings

import torch
import torch.distributed as dist

# Largest message the push kernel takes: decode and verify activations (32 rows of a 7168-wide hidden in bf16
# are 458 KB); prefill chunks are larger and go to NCCL, which moves bulk faster.
MAX_BYTES = 1 << 19
# per message dtype: the integer dtype its bits travel in, and the empty slot's bits (-0.0; the kernel's
# docstring, distributed/push_all_reduce_kernel.py)
BITS = {torch.bfloat16: (torch.int16, -(1 << 15)), torch.float32: (torch.int32, -(1 << 31))}


class SymmetricAllReduce:
    """One process group's buffers in symmetric memory and the push all-reduce over them."""

    def __init__(
        self, rank: int, buffers: dict[torch.dtype, torch.Tensor], device, owned: tuple = ()
    ) -> None:
        """``buffers``: per message dtype, the addresses [world] int64 of every rank's buffer [2, world, slot]
        in its bits' dtype (``BITS``; a slot: MAX_BYTES), emptied on every rank before any rank's
        first call; ``owned``: what keeps that memory and its mappings alive (buffers, rendezvous handles)."""
        self.rank = rank
        self.buffers = buffers
        # the calls made (push_all_reduce_kernel.py's docstring), and a call's finished programs
        self.epoch = torch.zeros(1, dtype=torch.int32, device=device)
        self.arrivals = torch.zeros(1, dtype=torch.int32, device=device)
        self.owned = owned

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

            world, rank = dist.get_world_size(device_group), dist.get_rank(device_group)
            buffers, owned = {}, []
            for dtype, (bits, empty) in BITS.items():
                own = symm_mem.empty(
                    2 * world * MAX_BYTES // bits.itemsize, dtype=bits, device=device
                )
                own.fill_(empty)
                handle = symm_mem.rendezvous(own, device_group.group_name)
                owned.append((own, handle))
                # (the tensor's offset in its allocation)
                at = own.data_ptr() - handle.buffer_ptrs[rank]
                addresses = [base + at for base in handle.buffer_ptrs]
                buffers[dtype] = torch.tensor(addresses, dtype=torch.int64, device=device)
            # every buffer empty before the agreement below lets a peer write
            torch.cuda.synchronize(device)
            made = cls(rank, buffers, device, owned)
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
        return x.dtype in BITS and x.is_contiguous() and x.numel() * x.element_size() <= MAX_BYTES

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (``takes(x)``) replaced by its sum over the group's ranks; returns ``x``."""
        from outpace.distributed.push_all_reduce_kernel import push_all_reduce_  # (Triton: GPUs)

        return push_all_reduce_(x, self)
