"""Sizing the paged KV pool from memory (``EngineConfig.num_kv_blocks`` None).

The engine builds the target, the drafter and the state rows over a provisional pool just large enough
for one prefill forward, then measures, as vLLM's profile run does (vllm/v1/worker/gpu_worker.py
``determine_available_memory``):
- in use: on CUDA, the device memory held now (weights, state rows, buffers, other processes) less the
  provisional caches and the blocks torch's allocator keeps free; on the CPU, nothing: the budget is a
  share of the memory still available (``MemAvailable``) once the models are loaded,
- the activation workspace: the allocation peak of one prefill forward of ``max_num_batched_tokens``
  tokens through the runner (target, first-token sampling, the drafter's absorb); on the CPU, the growth
  of the process's peak resident memory over it (an over-estimate when an earlier peak was higher),
- CUDA graphs: captured after the pool exists, so estimated as the workspace of a forward of the
  largest captured batch's tokens (in proportion to the prefill's), and measured after capture,
and gives the rest of the budget (``EngineConfig.memory_utilization``: ``gpu_memory_utilization``,
0.9 by default, of the GPU's memory; ``cpu_memory_utilization`` of the available RAM) to KV blocks,
each costing the target's and the drafter's rows for ``block_size`` tokens. The pool never takes
more blocks than ``max_num_seqs`` requests of the longest context fill.
With tensor parallelism every rank takes the smallest count any rank found (their schedules must agree).

Before any of this, ``refuse_too_many_seqs`` refuses a ``max_num_seqs`` whose per-sequence rows, allocated at
start-up whether requests come or not, cannot fit in memory: the block-table rows before the weights load, a hybrid
target's recurrent state once the target is built, and with the drafter's rows once it is built (engine/start_up.py).
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass

import torch

from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bound_dtypes, kv_cache_bytes, rebind_kv_caches
from outpace.config import EngineConfig
from outpace.distributed.group import RankGroup
from outpace.engine.warm_up import scratch_prefill
from outpace.layers.quant.loading import quantized_bytes
from outpace.layers.recurrent import RecurrentStateLayer
from outpace.validation import ConfigError

GiB = 1 << 30
# A sequence row's fixed fields on the device (engine/request_table.py: five int64 and six float32 fields and a
# bool; the decode step's int64 batch index), and on the host its entries in the request table's Python lists of
# rows (a pointer each, and an int object in the list of free rows)
ROW_FIELDS_BYTES = 5 * 8 + 6 * 4 + 1 + 8
ROW_LIST_BYTES = 2 * 8 + 32


@dataclass(frozen=True)
class SequenceRows:
    """What the engine allocates at start-up for each of ``max_num_seqs`` sequences and one padding row, before
    any request comes: a block-table row of ``table_blocks`` int64 entries, kept on the host and on the device
    (engine/request_table.py), its fixed fields, ``state_bytes`` of recurrent state with its verify snapshots on
    the device (hybrid targets: cache/recurrent_states.py) and ``drafter_bytes`` of the drafter's rows on the
    device (``drafter_row_bytes``). A bound from below: a recurrent draft's verify snapshots, a hybrid's state
    checkpoints and the rows a step run ahead saves come on top."""

    table_blocks: int
    state_bytes: int = 0
    drafter_bytes: int = 0

    @property
    def device_bytes(self) -> int:
        return self.table_blocks * 8 + ROW_FIELDS_BYTES + self.state_bytes + self.drafter_bytes

    @property
    def host_bytes(self) -> int:
        return self.table_blocks * 8 + ROW_LIST_BYTES

    def describe(self) -> str:
        parts = [f"a block-table row of {self.table_blocks} blocks"]
        if self.state_bytes:
            parts.append(f"{_size(self.state_bytes)} of recurrent state")
        if self.drafter_bytes:
            parts.append(f"{_size(self.drafter_bytes)} of the drafter's rows")
        return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _size(num_bytes: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"


def recurrent_state_bytes(stack: torch.nn.Module, verify_rows: int, dtype: torch.dtype) -> int:
    """One request's recurrent state and its ``verify_rows`` snapshot rows in the decoder stack ``stack``, as
    cache/recurrent_states.py ``RecurrentStates`` allocates them (a state declared without a dtype in ``dtype``);
    0 without recurrent layers."""
    state = sum(
        math.prod(shape) * (declared or dtype).itemsize
        for layer in stack.modules()
        if isinstance(layer, RecurrentStateLayer)
        for shape, declared in layer.state_shapes().values()
    )
    return state * (1 + verify_rows)


def drafter_row_bytes(proposer) -> int:
    """One sequence's row of every per-request buffer of the drafter (``Proposer.state()``, each indexed by request
    row first: the target's pending hidden states, a recurrent draft's state, an n-gram history)."""
    return sum(t.nbytes // t.shape[0] for t in proposer.state())


def available_ram() -> int:
    """The RAM available now (``MemAvailable``): taken before rows are allocated, what ``refuse_too_many_seqs``
    counts them against."""
    return _available_ram()


def _row_limits(
    config: EngineConfig, rows: SequenceRows, ram: int | None
) -> list[tuple[int, int, str]]:
    """(a sequence's bytes, the memory they must fit in, what that memory is) per kind of memory: on CUDA the
    device's share the engine may use and the RAM available; on the CPU the RAM available for both."""
    ram, where = _available_ram() if ram is None else ram, "the RAM available"
    if not config.device.startswith("cuda"):
        return [(rows.device_bytes + rows.host_bytes, ram, where)]
    total = torch.cuda.mem_get_info(torch.device(config.device))[1]
    share = config.memory_utilization
    gpu = f"the GPU's {total / GiB:.1f} GiB"
    if share is not None:
        gpu = f"{config.memory_utilization_field}={share:g} of {gpu}"
    return [(rows.device_bytes, int(total * (share or 1.0)), gpu), (rows.host_bytes, ram, where)]


def refuse_too_many_seqs(config: EngineConfig, rows: SequenceRows, ram: int | None = None) -> None:
    """Refuse, naming the numbers, a ``max_num_seqs`` whose sequences' ``rows`` (and the padding row's) cannot
    fit in memory, before any is allocated (else the allocator fails deep in start-up, or the OOM killer ends the
    process). Only what cannot fit even in otherwise empty memory is refused: no size that can serve. ``ram``: the
    RAM available before some of ``rows`` were allocated (``available_ram`` then; None: now)."""
    n = config.max_num_seqs + 1
    for per_row, budget, where in _row_limits(config, rows, ram):
        if n * per_row > budget:
            raise ConfigError(
                f"EngineConfig.max_num_seqs={config.max_num_seqs} is invalid: the engine allocates "
                f"{rows.describe()} for each sequence at start-up, {_size(per_row)} a sequence, "
                f"{_size(n * per_row)} for {n} rows (one for padding), more than {where} "
                f"({_size(budget)}): at most {max(budget // per_row - 1, 0)} sequences fit"
            )


@dataclass(frozen=True)
class MemoryPlan:
    """What sizing found, in bytes (``num_blocks`` blocks)."""

    device: str
    budget: int  # what the engine may use: a share of the GPU's memory, or of the RAM available
    in_use: int  # taken before any KV block (CUDA: weights, state rows, buffers, other processes)
    workspace: int  # the activation peak of a prefill forward
    graphs: int  # estimated for captured decode steps (0 without them)
    block_bytes: int  # one block's rows in every cache (target and drafter), at their element sizes
    num_blocks: int
    limit: int  # blocks max_num_seqs full-length requests fill
    cache_dtypes: str = ""  # the caches' dtypes (an FP8 cache: 1 byte an element, twice the blocks)

    def summary(self, block_size: int) -> str:
        free = self.budget - self.in_use - self.workspace - self.graphs
        capped = (
            " (capped: max_num_seqs requests of the longest context)"
            if self.num_blocks == self.limit
            else ""
        )
        return (
            f"KV cache sized from {self.device} memory: {self.num_blocks} blocks of {block_size} tokens = "
            f"{self.num_blocks * block_size} tokens, {self.num_blocks * self.block_bytes / GiB:.3f} GiB"
            f"{capped}; budget {self.budget / GiB:.3f} GiB, in use {self.in_use / GiB:.3f} GiB, activation "
            f"workspace {self.workspace / GiB:.3f} GiB, CUDA graphs ~{self.graphs / GiB:.3f} GiB, left for KV "
            f"{max(free, 0) / GiB:.3f} GiB at {self.block_bytes / 1024:.1f} KiB per block"
            f"{f' ({self.cache_dtypes})' if self.cache_dtypes else ''}"
        )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Restart the process's peak RSS (VmHWM) from its current RSS (Linux: 5 written to /proc/self/clear_refs),
    so that the peak after it is this measurement's and not an earlier engine's in the same process (a test
    worker, a bench building engines in turn). False where the kernel does not allow it: the peak is then
    the process's lifetime one, which can only overstate the workspace."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    """The peak RSS since the last ``_reset_peak_rss`` (VmHWM), or over the process's life."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _available_ram() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def plan_kv_pool(
    runner,
    pool: BlockPool,
    device: torch.device,
    utilization: float,
    profile_tokens: int,
    graph_tokens: int,
    limit: int,
) -> MemoryPlan:
    """Measure (module docstring) with the provisional pool bound; ``graph_tokens``: the largest captured
    step's tokens (0: no graphs); ``limit``: the most blocks worth having."""
    provisional = kv_cache_bytes(pool)
    block_bytes = -(-provisional // (pool.num_blocks + 1))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        in_use = total - free - cached - provisional
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        scratch_prefill(runner, pool, [profile_tokens])
        torch.cuda.synchronize(device)
        workspace = torch.cuda.max_memory_allocated(device) - base
        budget = int(total * utilization)
    else:
        available, base = _available_ram(), _rss_bytes()
        _reset_peak_rss()  # (else an earlier, larger engine's peak would count as this one's workspace)
        scratch_prefill(runner, pool, [profile_tokens])
        workspace = max(_peak_rss_bytes() - base, 0)
        in_use, budget = 0, int(available * utilization)
    graphs = workspace * min(graph_tokens, profile_tokens) // profile_tokens
    fits = (budget - in_use - workspace - graphs) // block_bytes
    return MemoryPlan(
        device.type,
        budget,
        in_use,
        workspace,
        graphs,
        block_bytes,
        max(min(fits, limit), 0),
        limit,
        bound_dtypes(pool),
    )


def weights_summary(model: torch.nn.Module, quantization) -> str:
    """The start-up line on the weights: their bytes as stored (what the budget above finds in use) and, for a
    quantized checkpoint (``ModelConfig.quantization``), the format and the bytes of its quantized projections."""
    quantized, total = quantized_bytes(model)
    line = f"weights: {total / GiB:.3f} GiB as stored"
    if quantization is None:
        return line
    return f"{line}; {quantization.description}: {quantized / GiB:.3f} GiB of quantized projections"


def agree_across_ranks(num_blocks: int, group: RankGroup) -> int:
    """The smallest of every rank's count (each rank measured its own device)."""
    if group.size == 1:
        return num_blocks
    import torch.distributed as dist

    box = torch.tensor([num_blocks], dtype=torch.int64)
    dist.all_reduce(box, op=dist.ReduceOp.MIN, group=group.cpu_group)
    return int(box.item())


def resize_kv_pool(runner, pool: BlockPool, num_blocks: int) -> None:
    """Reallocate every cache bound to the pool (target and drafter) at ``num_blocks`` blocks."""
    pool.resize(num_blocks)
    rebind_kv_caches(pool)
    runner.rebind_kv()


def refuse_too_small(plan: MemoryPlan, min_blocks: int, block_size: int, field: str) -> None:
    """A pool that cannot hold even one request of ``min_blocks`` blocks is refused, naming the numbers."""
    if plan.num_blocks < min_blocks:
        raise ConfigError(
            f"not enough memory for the KV cache: {plan.num_blocks} blocks fit, one request needs "
            f"{min_blocks} ({plan.summary(block_size)}); raise EngineConfig.{field}, lower "
            f"max_num_batched_tokens, or give num_kv_blocks"
        )
