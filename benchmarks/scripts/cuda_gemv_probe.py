"""How fast can a weight be streamed at batch 1 outside Triton? The one-row products of the shapes whose
kernels read far under the floor (issue 43's batch-1 MoE layers: o_proj's 16.8 MB at 1.9 TB/s; issue 44's
block-FP8 projections: 13.1 us for 25 MB), each timed these ways:

- ours: the shipped few-row kernels (bf16: layers/fused_projection.py ``project_rows``, with programmatic
  dependent launch and without; block FP8: layers/quant/quant_matmul_kernel.py ``quant_matmul``, with its row
  streams and without, and in row streams of other rows a program and K steps);
- torch: ``F.linear`` on the bf16 weight (cuBLAS);
- cuda: the plain CUDA products of cuda_gemv_probe.cu (16-byte loads, a block of 256 threads a few rows,
  a step's loads in flight before its products), compiled here with nvcc and launched through the driver
  API on torch's stream, at each rows-a-block setting (the fastest reported), plainly and with programmatic
  dependent launch;
- triton: the CUDA kernels' structure written in Triton (``_rows_product``), plainly and with programmatic
  dependent launch: whether Triton's code streams as the CUDA kernel does;
- empty: a kernel that writes one value, the least a launch costs in such a graph;

and one token's routed experts (bf16, SiLU-gated: gate/up, then down and the weighted sum over slots) by ours
(layers/grouped_experts.py) and by two CUDA launches, in a graph of 4 layers' distinct stacks.

Each time is one call's share of a CUDA graph of 8 calls on 8 distinct weights (more bytes than L2 holds), as
fp8_projection_settings.py times; every output is checked against F.linear first. If the CUDA products read
much faster than ours, the batch-1 gap is Triton's code, not the hardware's latency.

    PYTHONPATH=. python3 benchmarks/scripts/cuda_gemv_probe.py [OUT.json]"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from fp8_projection_settings import graph_us  # noqa: E402

from outpace.layers.expert_blocks import align  # noqa: E402
from outpace.layers.fused_projection import project_rows  # noqa: E402
from outpace.layers.grouped_experts import grouped_experts  # noqa: E402
from outpace.layers.pdl import pdl_enter, pdl_launch_options, prefetch_l2  # noqa: E402
from outpace.layers.quant import quant_matmul_kernel as qm  # noqa: E402
from outpace.layers.quant.dequantize import dequantize_fp8_block, quantize_fp8_block  # noqa: E402

BLOCK = (128, 128)
CALLS = 8
THREADS = 256  # cuda_gemv_probe.cu's block
ROWS = (1, 2, 4, 8)  # the .cu's instances: weight rows a block
SHAPES = {  # name: (N, K)
    "deepseek-v2-lite kv_a": (576, 2048),
    "deepseek-v2-lite o": (2048, 2048),
    "qwen3-30b-a3b o_proj": (2048, 4096),
    "qwen3-30b-a3b qkv": (5120, 2048),
    "step-3.5 tp2 q_proj": (6144, 4096),
    "qwen3-next in_proj_qkvz": (12288, 2048),
    "llama-8b down_proj": (4096, 14336),
}


@triton.jit
def _rows_product(
    w, scale, x, y, N, K, scale_columns,
    ROWS: tl.constexpr, BK: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The CUDA kernels' structure in Triton: a program owns ROWS weight rows and reads their whole K, BK
    columns a step ([ROWS, BK] loads, spread over its threads 16 bytes each), products on the CUDA cores,
    one sum along K at the end. FP8: block FP8 (128 x 128 scales, each 128-column group's sum scaled)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < N
    if PDL:  # the first step's weight lines into L2 while the kernel before drains (the weight is no output)
        LINE: tl.constexpr = 128 if FP8 else 64  # weight values a 128-byte line
        lines = tl.arange(0, BK // LINE) * LINE
        first = w + rows[:, None].to(tl.int64) * K + lines[None, :]
        prefetch_l2(tl.where(row_ok[:, None] & (lines < K)[None, :], first, w))
    pdl_enter(PDL)
    if FP8:
        acc = tl.zeros([ROWS, BK // 128], tl.float32)
    else:
        acc = tl.zeros([ROWS, BK], tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        wt = tl.load(
            w + rows[:, None].to(tl.int64) * K + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
            eviction_policy="evict_first",
        )
        xt = tl.load(x + ks, mask=k_ok, other=0.0).to(tl.float32)
        prod = wt.to(tl.float32) * xt[None, :]  # [ROWS, BK]
        if FP8:
            groups = k0 // 128 + tl.arange(0, BK // 128)
            s = tl.load(
                scale + (rows // 128)[:, None] * scale_columns + groups[None, :],
                mask=row_ok[:, None] & (groups < scale_columns)[None, :],
                other=0.0,
            )
            acc += tl.sum(tl.reshape(prod, [ROWS, BK // 128, 128]), axis=2) * s
        else:
            acc += prod
    tl.store(y + rows, tl.sum(acc, axis=1).to(y.dtype.element_ty), mask=row_ok)


def triton_rows(w, scale, x, y, rows: int, pdl: bool, fp8: bool) -> torch.Tensor:
    """``_rows_product`` with 8 warps and BK = 8 warps x 32 threads x 16 bytes (2048 bf16 or 4096 fp8 values)."""
    n, k = w.shape
    bk = min(4096 if fp8 else 2048, triton.next_power_of_2(k))
    _rows_product[(triton.cdiv(n, rows),)](
        w, scale if fp8 else w, x, y, n, k, scale.shape[1] if fp8 else 0,
        ROWS=rows, BK=bk, FP8=fp8, PDL=pdl, num_warps=8, **pdl_launch_options(pdl),
    )  # fmt: skip
    return y


# CUDA's driver API structs for cuLaunchKernelEx (cuda.h): one launch attribute, programmatic stream
# serialization (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6), the launch's programmatic
# dependent launch.
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


# name: (experts, top_k, hidden, intermediate), bench/family_shapes.py's configs (SiLU-gated); at most
# STACKED experts stacked, LAYERS distinct stacks in a graph
EXPERTS = {
    "deepseek-v2-lite": (64, 6, 2048, 1408),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-next-80b": (512, 10, 2048, 512),
}
STACKED, LAYERS = 64, 4
EXPERT_ROWS = (1, 2, 4)  # the .cu's expert instances


class CudaProducts:
    """cuda_gemv_probe.cu compiled for this GPU and loaded through the driver API (libcuda)."""

    def __init__(self) -> None:
        source = Path(__file__).with_suffix(".cu")
        major, minor = torch.cuda.get_device_capability()
        cubin = Path(tempfile.mkdtemp()) / "gemv.cubin"
        subprocess.run(
            ["nvcc", "-cubin", f"-arch=sm_{major}{minor}", "-O3", "-o", str(cubin), str(source)],
            check=True,
        )
        torch.cuda.init()
        torch.empty(1, device="cuda")  # torch's context current on this thread
        self.driver = ctypes.CDLL("libcuda.so.1")
        self.module = ctypes.c_void_p()
        image = cubin.read_bytes()
        self._check(
            self.driver.cuModuleLoadData(ctypes.byref(self.module), image), "cuModuleLoadData"
        )
        self.functions: dict[str, ctypes.c_void_p] = {}

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            f = ctypes.c_void_p()
            self._check(
                self.driver.cuModuleGetFunction(ctypes.byref(f), self.module, name.encode()), name
            )
            self.functions[name] = f
        return self.functions[name]

    def launch(self, name: str, grid: int | tuple[int, int], args: list, pdl: bool = False) -> None:
        """``name`` over ``grid`` blocks of 256 threads on torch's current stream; ``args``: tensors and ints;
        ``pdl``: with programmatic dependent launch (the kernel's griddepcontrol instructions)."""
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        values = [
            ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a)
            for a in args
        ]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if not pdl:
            status = self.driver.cuLaunchKernel(
                self.function(name), gx, gy, 1, THREADS, 1, 1, 0, stream, params, None
            )
            return self._check(status, name)
        attribute = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        attribute.value[0] = 1
        config = _LaunchConfig(
            (ctypes.c_uint * 3)(gx, gy, 1), (ctypes.c_uint * 3)(THREADS, 1, 1), 0, stream
        )
        config.attrs, config.num_attrs = ctypes.pointer(attribute), 1
        status = self.driver.cuLaunchKernelEx(
            ctypes.byref(config), self.function(name), params, None
        )
        self._check(status, name)


def checked_us(calls, first, ref: torch.Tensor, count: int = CALLS) -> float | None:
    """us a call of ``calls()`` (``count`` calls) in a graph, None where ``first()``'s output is wrong or a
    launch fails."""
    try:
        got = first().float().reshape(ref.shape)
        err = ((got - ref).norm() / ref.norm()).item()
        if not err < 2e-2:
            print(f"    wrong output (relative error {err:.3g})", flush=True)
            return None
        return graph_us(calls) * CALLS / count  # (graph_us shares the graph among CALLS calls)
    except Exception as e:  # noqa: BLE001 (a probe: one variant's failure must not stop the others)
        print(f"    {type(e).__name__}: {str(e)[:160]}", flush=True)
        return None


def probe_shape(cuda: CudaProducts, name: str, n: int, k: int, device) -> dict:
    raw = torch.randn(n, k, device=device) * 0.02
    q, scale = quantize_fp8_block(raw, BLOCK)
    dense = dequantize_fp8_block(q, scale, BLOCK)
    bf16 = [dense.to(torch.bfloat16) for _ in range(CALLS)]
    fp8 = [(q.clone(), scale.clone().float()) for _ in range(CALLS)]
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    ref = F.linear(x.float(), dense)  # [1, N]
    ys = [torch.empty(n, dtype=torch.bfloat16, device=device) for _ in range(CALLS)]
    t: dict[str, float | None] = {}
    t["bf16 ours"] = checked_us(
        lambda: [project_rows(x, w) for w in bf16], lambda: project_rows(x, bf16[0]), ref
    )
    t["bf16 ours, no PDL"] = checked_us(
        lambda: [project_rows(x, w, pdl=False) for w in bf16],
        lambda: project_rows(x, bf16[0], pdl=False),
        ref,
    )
    t["bf16 torch"] = checked_us(
        lambda: [F.linear(x, w) for w in bf16], lambda: F.linear(x, bf16[0]), ref
    )
    t["fp8 ours"] = checked_us(
        lambda: [qm.quant_matmul(x, w, s, "fp8_block", BLOCK) for w, s in fp8],
        lambda: qm.quant_matmul(x, fp8[0][0], fp8[0][1], "fp8_block", BLOCK),
        ref,
    )
    with _setting(qm, "one_row_streams", False):
        t["fp8 ours, no streams"] = checked_us(
            lambda: [qm.quant_matmul(x, w, s, "fp8_block", BLOCK) for w, s in fp8],
            lambda: qm.quant_matmul(x, fp8[0][0], fp8[0][1], "fp8_block", BLOCK),
            ref,
        )
    t.update(stream_settings(x, fp8, ref))
    for rows, pdl in itertools.product(ROWS, (False, True)):
        grid, tag = -(-n // rows), "_pdl" if pdl else ""

        def bf16_call(i: int, rows=rows, grid=grid, tag=tag, pdl=pdl) -> torch.Tensor:
            cuda.launch(f"gemv_bf16{tag}_r{rows}", grid, [bf16[i], x, ys[i], n, k], pdl)
            return ys[i]

        def fp8_call(i: int, rows=rows, grid=grid, tag=tag, pdl=pdl) -> torch.Tensor:
            w, s = fp8[i]
            cuda.launch(f"gemv_fp8{tag}_r{rows}", grid, [w, s, x, ys[i], n, k], pdl)
            return ys[i]

        def bf16_triton(i: int, rows=rows, pdl=pdl) -> torch.Tensor:
            return triton_rows(bf16[i], None, x, ys[i], rows, pdl, False)

        def fp8_triton(i: int, rows=rows, pdl=pdl) -> torch.Tensor:
            return triton_rows(fp8[i][0], fp8[i][1], x, ys[i], rows, pdl, True)

        for dtype, f in (("bf16", bf16_triton), ("fp8", fp8_triton)):
            t[f"{dtype} triton{tag} r{rows}"] = checked_us(
                lambda f=f: [f(i) for i in range(CALLS)], lambda f=f: f(0), ref
            )
        for dtype, f in (("bf16", bf16_call), ("fp8", fp8_call)):
            t[f"{dtype} cuda{tag} r{rows}"] = checked_us(
                lambda f=f: [f(i) for i in range(CALLS)], lambda f=f: f(0), ref
            )
    return {"shape": name, "n": n, "k": k, "us": t}


@contextlib.contextmanager
def _setting(module, name: str, value):
    shipped = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, shipped)


def stream_settings(x, fp8, ref) -> dict[str, float | None]:
    """Ours in row streams (quant_matmul_kernel.py ``one_row_streams``) at other rows a program and K steps:
    "fp8 streams r{rows} k{BK}"."""
    k = x.shape[1]
    t = {}
    for rows, bk in itertools.product((2, 4, 8), (1024, 2048, 4096)):
        if bk > triton.next_power_of_2(k):
            continue
        tiles = qm.QuantTiles(1, rows, bk, 1, triton.cdiv(k, bk) * bk, 8, 1)
        t[f"fp8 streams r{rows} k{bk}"] = checked_us(
            lambda: [qm.quant_matmul(x, w, s, "fp8_block", BLOCK, tiles) for w, s in fp8],
            lambda: qm.quant_matmul(x, fp8[0][0], fp8[0][1], "fp8_block", BLOCK, tiles),
            ref,
        )
    return t


def probe_experts(cuda: CudaProducts, name: str, experts, top_k, hidden, inter, device) -> dict:
    """One token's routed experts: ours (layers/grouped_experts.py) against the two CUDA launches."""
    experts = min(experts, STACKED)

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

    stacks = [
        (rand(experts, inter, hidden), rand(experts, inter, hidden), rand(experts, hidden, inter))
        for _ in range(LAYERS)
    ]
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randperm(experts, generator=gen)[:top_k][None].int().to(device) for _ in stacks]
    routing = torch.rand(1, top_k, device=device)
    x = torch.randn(1, hidden, device=device, dtype=torch.bfloat16)
    layouts = [align(i, experts) for i in ids]
    h = torch.empty(top_k, inter, device=device)
    ys = [torch.empty(hidden, dtype=torch.bfloat16, device=device) for _ in stacks]

    def ours(i: int) -> torch.Tensor:
        gate, up, down = stacks[i]
        return grouped_experts(x, routing, ids[i], gate, up, down, layout=layouts[i])

    gate, up, down = (t.float() for t in stacks[0])
    e = ids[0][0].long()
    hidden_act = F.silu(x.float() @ gate[e].transpose(1, 2)) * (x.float() @ up[e].transpose(1, 2))
    h_ref = hidden_act.to(
        torch.bfloat16
    ).float()  # [top_k, 1, inter], rounded as the experts round it
    ref = torch.einsum("s,sdi,si->d", routing[0], down[e], h_ref[:, 0])[None]
    t = {"ours": checked_us(lambda: [ours(i) for i in range(LAYERS)], lambda: ours(0), ref, LAYERS)}
    for rows in EXPERT_ROWS:

        def call(i: int, rows=rows) -> torch.Tensor:
            gate, up, down = stacks[i]
            grid = (-(-inter // rows), top_k)
            cuda.launch(f"experts_gate_up_r{rows}", grid, [gate, up, ids[i], x, h, inter, hidden])
            cuda.launch(
                f"experts_down_r{rows}",
                -(-hidden // rows),
                [down, ids[i], routing, h, ys[i], top_k, hidden, inter],
            )
            return ys[i]

        t[f"cuda r{rows}"] = checked_us(
            lambda call=call: [call(i) for i in range(LAYERS)],
            lambda call=call: call(0),
            ref,
            LAYERS,
        )
    return {"shape": name, "experts": experts, "top_k": top_k, "us": t}


def best(times: dict, prefix: str) -> float | None:
    """The least time among the settings named ``prefix`` + rows a block."""
    return min(
        (v for s, v in times.items() if s.startswith(prefix) and v is not None), default=None
    )


def copy_bandwidth(device) -> float:
    """Bytes a second of a device-to-device copy of 1 GiB, counting bytes read and written."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    from triton.testing import do_bench

    return 2 * a.numel() / (do_bench(lambda: b.copy_(a), return_mode="median") * 1e-3)


def main(out: str | None = None) -> None:
    device = torch.device("cuda")
    cuda = CudaProducts()
    flag = torch.empty(1, device=device)
    empty = graph_us(lambda: [cuda.launch("empty_kernel", 132, [flag]) for _ in range(CALLS)])
    bandwidth = copy_bandwidth(device)
    print(
        f"{torch.cuda.get_device_name()}: copy {bandwidth / 1e12:.2f} TB/s; empty kernel {empty:.2f} us a call"
    )
    rows = []
    for name, (n, k) in SHAPES.items():
        row = probe_shape(cuda, name, n, k, device)
        row["floor_bf16_us"] = 2 * n * k / bandwidth * 1e6
        row["floor_fp8_us"] = (n * k + 4 * (-(-n // 128)) * (-(-k // 128))) / bandwidth * 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"\nus a call in a graph of {CALLS} (floor: bytes over the copy bandwidth; cuda: the best rows a block)"
    )
    print(
        f"{'shape':>26} | {'bf16 floor':>10} {'ours':>6} {'noPDL':>6} {'torch':>6} {'cuda':>6} {'PDL':>6} "
        f"{'triton':>6} {'PDL':>6} | {'fp8 floor':>9} {'ours':>6} {'cuda':>6} {'PDL':>6} {'triton':>6} {'PDL':>6}"
    )

    def f(v):
        return f"{v:6.2f}" if v is not None else "     -"

    for r in rows:
        t = r["us"]
        print(
            f"{r['shape']:>26} | {r['floor_bf16_us']:10.2f} {f(t['bf16 ours'])} "
            f"{f(t['bf16 ours, no PDL'])} {f(t['bf16 torch'])} {f(best(t, 'bf16 cuda r'))} "
            f"{f(best(t, 'bf16 cuda_pdl r'))} {f(best(t, 'bf16 triton r'))} {f(best(t, 'bf16 triton_pdl r'))} | "
            f"{r['floor_fp8_us']:9.2f} {f(t['fp8 ours'])} {f(best(t, 'fp8 cuda r'))} "
            f"{f(best(t, 'fp8 cuda_pdl r'))} {f(best(t, 'fp8 triton r'))} {f(best(t, 'fp8 triton_pdl r'))}"
        )
    print("\nfp8: ours without row streams, shipped, and the best row streams, us a call")
    print(f"{'shape':>26} | {'before':>6} {'ours':>6} {'best':>6} {'at':>9}")
    for r in rows:
        t = r["us"]
        streams = {s: v for s, v in t.items() if s.startswith("fp8 streams") and v is not None}
        at = min(streams, key=streams.get, default=None)
        print(
            f"{r['shape']:>26} | {f(t['fp8 ours, no streams'])} {f(t['fp8 ours'])} {f(streams.get(at))} "
            f"{(at or '-').split('streams ')[-1]:>9}"
        )
    expert_rows = []
    for name, (experts, top_k, hidden, inter) in EXPERTS.items():
        row = probe_experts(cuda, name, experts, top_k, hidden, inter, device)
        row["floor_us"] = 3 * top_k * hidden * inter * 2 / bandwidth * 1e6
        expert_rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\none token's routed experts (bf16), us a layer in a graph of {LAYERS}")
    print(f"{'shape':>26} | {'floor':>6} {'ours':>6} {'cuda':>6}")
    for r in expert_rows:
        t = r["us"]
        print(f"{r['shape']:>26} | {r['floor_us']:6.2f} {f(t['ours'])} {f(best(t, 'cuda r'))}")
    if out:
        Path(out).write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(),
                    "copy_bytes_per_s": bandwidth,
                    "empty_us": empty,
                    "rows": rows,
                    "experts": expert_rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
