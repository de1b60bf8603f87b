"""Attention micro-benchmark (``python -m outpace.bench.attention [out.json]``): one attention call
at the Llama-3.1-8B head shape (32 q heads, 8 kv heads, head_dim 128, bf16, block_size 16, random KV
behind a shuffled block table) for decode (1 query token per sequence), chain verify (6) and a
16-node tree (custom ancestor mask), at batch 1, 8, 32, 64 and contexts (cached rows) 512 and 4096,
for three implementations:

- ``triton``: the Triton paged backend, KV write + attention.
- ``flex``: torch's FlexAttention compiled with torch.compile (dynamic=False: its decoding kernel
  needs a static batch), over the KV gathered to dense [batch, kv_heads, kv_len, head_dim] per
  sequence, with a block mask from a mask_mod expressing the same causal / tree rule. The KV write,
  the gather and the block mask are built outside the timed region: its time is attention only.
- ``torch``: the torch backend, KV write + gather + SDPA under a boolean mask.

On CUDA, each call is captured in a CUDA graph (launch overhead excluded, as in the engine) and
times are GPU medians of its replays from ``triton.testing.do_bench``, which flushes the L2 cache before
every call (a batch-1 KV fits in the H100's L2). Bandwidth is the KV bytes attention must read
(seq_len rows of K and V per sequence) over that time. Every row also gives the largest absolute
difference from the torch backend's output. A failing implementation records its error in its row
and the run goes on; FlexAttention rows are skipped once they have taken ``flex_compile_budget_s``
(one compile per shape: 24 in all).
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from outpace.attention import PagedAttentionMetadata, build_paged_metadata
from outpace.attention.torch_backend import TorchAttentionBackend
from outpace.bench.graph_timing import captured_call_us

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
KINDS = {"decode": 1, "verify": 6, "tree": 16}  # query tokens per sequence
BATCHES, CONTEXTS = (
    (1, 8, 32, 64),
    (4096, 512),
)  # the long context first: it gets FlexAttention's compile budget
FLEX_NOTE = "KV write, gather to dense and block mask outside the timed region"


@dataclass
class _Inputs:
    q: torch.Tensor  # [num_tokens, HEADS, HEAD_DIM]
    k: torch.Tensor  # [num_tokens, KV_HEADS, HEAD_DIM]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM]
    v_cache: torch.Tensor
    meta: PagedAttentionMetadata

    def kv_bytes(self) -> int:
        """Bytes of K and V that attention reads: every sequence's seq_len rows."""
        rows = int(self.meta.seq_lens.sum())
        return 2 * rows * KV_HEADS * HEAD_DIM * self.k_cache.element_size()


def _tree_mask(n: int, g: torch.Generator) -> torch.Tensor:
    """[n, n] bool: node i sees itself and its ancestors in a random tree (node 0 the root)."""
    seen = torch.eye(n, dtype=torch.bool)
    for node in range(1, n):
        seen[node] |= seen[int(torch.randint(0, node, (1,), generator=g))]
    return seen


def _inputs(
    k_cache, v_cache, tables: list[list[int]], context: int, kind: str, device, g
) -> _Inputs:
    batch, q_len = len(tables), KINDS[kind]
    masks = [_tree_mask(q_len, g).to(device) for _ in range(batch)] if kind == "tree" else None
    meta = build_paged_metadata(
        tables, [context] * batch, [q_len] * batch, BLOCK_SIZE, device, masks
    )
    q = torch.randn(batch * q_len, HEADS, HEAD_DIM, device=device, dtype=k_cache.dtype)
    k = torch.randn(batch * q_len, KV_HEADS, HEAD_DIM, device=device, dtype=k_cache.dtype)
    v = torch.randn_like(k)
    return _Inputs(q, k, v, k_cache, v_cache, meta)


def _torch_call(x: _Inputs, scale: float):
    backend = TorchAttentionBackend()
    return lambda: backend.forward(x.q, x.k, x.v, (x.k_cache, x.v_cache), x.meta, scale)


def _triton_call(x: _Inputs, scale: float):
    from outpace.attention.triton_backend import TritonAttentionBackend

    backend = TritonAttentionBackend()
    return lambda: backend.forward(x.q, x.k, x.v, (x.k_cache, x.v_cache), x.meta, scale)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_call(x: _Inputs, scale: float):
    """FlexAttention over dense copies of each sequence's KV (new tokens written first)."""
    from torch.nn.attention.flex_attention import create_block_mask

    meta = x.meta
    n, q_len = meta.num_seqs, meta.max_query_len
    for cache, new in ((x.k_cache, x.k), (x.v_cache, x.v)):
        cache.view(-1, KV_HEADS, HEAD_DIM).index_copy_(0, meta.slot_mapping, new)
    rows = meta.block_tables.shape[1] * BLOCK_SIZE
    kv_len = -(-rows // 128) * 128  # whole flex blocks; the mask hides the padding

    def dense(cache: torch.Tensor) -> torch.Tensor:  # -> [n, KV_HEADS, kv_len, HEAD_DIM]
        per_seq = cache[meta.block_tables].view(n, rows, KV_HEADS, HEAD_DIM)
        return F.pad(per_seq, (0, 0, 0, 0, 0, kv_len - rows)).transpose(1, 2).contiguous()

    k_dense, v_dense = dense(x.k_cache), dense(x.v_cache)
    seq_lens, prefix = meta.seq_lens, meta.seq_lens - meta.query_lens
    if meta.custom_mask is None:

        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= prefix[b] + q_idx
    else:
        tree, window = meta.custom_mask, meta.custom_mask.shape[2]

        def mask_mod(b, h, q_idx, kv_idx):
            rel = kv_idx - (seq_lens[b] - window)
            return (rel < 0) | ((rel < window) & tree[b, q_idx, rel.clamp(0, window - 1)])

    block_mask = create_block_mask(mask_mod, n, None, q_len, kv_len, device=x.q.device)
    q4 = (
        x.q.view(n, q_len, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    )  # [n, HEADS, q_len, HEAD_DIM]
    flex = _compiled_flex()

    return lambda: flex(q4, k_dense, v_dense, block_mask=block_mask, scale=scale, enable_gqa=True)


_CALLS = {"triton": _triton_call, "flex": _flex_call, "torch": _torch_call}


def _time_us(fn, device: torch.device) -> float:
    """Median microseconds per call: on CUDA the GPU time of the call captured in a CUDA graph (as the
    engine runs it: without the host's launch overhead), via do_bench; wall clock elsewhere (smoke runs)."""
    if device.type == "cuda":
        return captured_call_us(fn)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _measure(
    impl: str, x: _Inputs, scale: float, reference: torch.Tensor, device: torch.device
) -> dict:
    """Time one implementation on ``x``: microseconds, bandwidth and its difference from ``reference``."""
    fn = _CALLS[impl](x, scale)
    out = fn()  # compiles (Triton, FlexAttention) outside the timing
    if (
        out.dim() == 4
    ):  # FlexAttention's [batch, HEADS, q_len, HEAD_DIM] -> the backends' [num_tokens, HEADS, HEAD_DIM]
        out = out.transpose(1, 2).reshape(-1, HEADS, HEAD_DIM)
    diff = (out.float() - reference.float()).abs().max().item()
    us = _time_us(fn, device)
    return {
        "microseconds": us,
        "kv_bandwidth_gb_per_s": x.kv_bytes() / us / 1e3,
        "max_abs_diff_vs_torch": diff,
    }


def run_attention_bench(
    device="cuda",
    batches=BATCHES,
    contexts=CONTEXTS,
    impls=tuple(_CALLS),
    flex_compile_budget_s: float = 90.0,
    out_json: str | None = None,
) -> list[dict]:
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    scale = HEAD_DIM**-0.5
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    rows, flex_s = [], 0.0  # flex_s: time spent in FlexAttention rows (compiles dominate)
    limit = len(batches) * len(contexts) * len(KINDS) + 8  # one FlexAttention compile per shape
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=limit):
        for context in contexts:
            for batch in batches:
                per_seq = -(-(context + max(KINDS.values())) // BLOCK_SIZE)
                num_blocks = batch * per_seq + 1  # block 0: the tables' padding block, never used
                perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
                tables = [perm[i * per_seq : (i + 1) * per_seq] for i in range(batch)]
                k_cache = torch.randn(
                    num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=device, dtype=dtype
                )
                v_cache = torch.randn_like(k_cache)
                for kind, q_len in KINDS.items():
                    x = _inputs(k_cache, v_cache, tables, context, kind, device, g)
                    reference = _torch_call(x, scale)()
                    for impl in impls:
                        row = {
                            "impl": impl,
                            "kind": kind,
                            "batch": batch,
                            "context": context,
                            "query_len": q_len,
                            "kv_bytes": x.kv_bytes(),
                            "device": name,
                            "microseconds": None,
                            "kv_bandwidth_gb_per_s": None,
                            "max_abs_diff_vs_torch": None,
                            "error": None,
                            "note": FLEX_NOTE if impl == "flex" else "KV write included",
                        }
                        t0 = time.perf_counter()
                        try:
                            if impl == "flex" and flex_s > flex_compile_budget_s:
                                raise RuntimeError(
                                    f"skipped: FlexAttention budget of {flex_compile_budget_s:.0f} s "
                                    "(compiles) spent"
                                )
                            row.update(_measure(impl, x, scale, reference, device))
                        except Exception as e:  # noqa: BLE001 (one failure must not end the run)
                            row["error"] = f"{type(e).__name__}: {e}"[:500]
                        if impl == "flex":
                            flex_s += time.perf_counter() - t0
                        rows.append(row)
                    del x, reference
                del k_cache, v_cache
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    _print_table(rows, name)
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def _print_table(rows: list[dict], name: str) -> None:
    print(
        f"attention, {HEADS} q heads / {KV_HEADS} kv heads, head_dim {HEAD_DIM}, block {BLOCK_SIZE}, on {name}"
    )
    print(
        f"{'impl':>7} {'kind':>7} {'batch':>6} {'context':>8} {'us':>9} {'KV GB/s':>9} {'max diff':>9}"
    )
    for r in rows:
        if r["error"]:
            print(
                f"{r['impl']:>7} {r['kind']:>7} {r['batch']:>6} {r['context']:>8}  {r['error'][:80]}"
            )
        else:
            print(
                f"{r['impl']:>7} {r['kind']:>7} {r['batch']:>6} {r['context']:>8} {r['microseconds']:>9.1f} "
                f"{r['kv_bandwidth_gb_per_s']:>9.0f} {r['max_abs_diff_vs_torch']:>9.2e}"
            )
    print(
        f"flex: {FLEX_NOTE}; triton and torch: KV write included. GPU medians, L2 flushed before each call."
    )


if __name__ == "__main__":
    run_attention_bench(out_json=sys.argv[1] if len(sys.argv) > 1 else None)
