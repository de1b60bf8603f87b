"""What the load-time weight checks cost (outpace/weight_checks.py, called by checkpoint.py
``load_checkpoint``: a dtype check per tensor, a float32 sum per tensor queued on the device and one
host sync): a checkpoint's ``load_model`` time with the checks and without (interleaved, after one
warm-up load that fills the page cache), and on the loaded model the finiteness check alone beside the
alternative it replaced, ``torch.isfinite(t).all()`` per tensor, plus the file header checks alone.

    python benchmarks/scripts/load_check_cost.py --shape 1b --device cpu --dtype float32
    python benchmarks/scripts/load_check_cost.py --shape 8b --device cuda --dtype bfloat16   # GPU machine

Shapes: tinypy (zoo/tinypy), 1b (Llama-3.2-1B), 8b (Llama-3.1-8B): random bf16 checkpoints of the real
shapes (bench/random_checkpoint.py), written under ``--workdir`` once and kept (8b: 16 GB on disk, and
as much memory again to load it). Prints one JSON object; ``--out`` also writes it to a file.

2026-11-29, the H200 device machine (16 CPU cores, otherwise idle), checked against unchecked loads,
medians of interleaved runs:
- 8b on the H200, bf16 (8.03B parameters, 291 tensors, 16.1 GB): 2.083 s against 2.058 s (8 runs each;
  the unchecked ones spread 2.01-2.22 s). The finiteness check alone 7.6-8.0 ms (isfinite_all 33.6 ms);
  the header checks 1 ms.
- 1b on the CPU, fp32, 16 threads (1.24B parameters, 146 tensors): 7.29 s against 7.29 s (5 runs
  each); the check alone 61 ms (isfinite_all 864 ms).
- tinypy on the CPU, fp32, 16 threads: 63 ms against 61 ms (8 runs each); the check alone 2.2 ms
  (isfinite_all 13.7 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from outpace import checkpoint  # noqa: E402
from outpace.bench.gpu import LLAMA_8B  # noqa: E402
from outpace.bench.random_checkpoint import random_target  # noqa: E402
from outpace.models.loader import load_model  # noqa: E402
from outpace.weight_checks import FinitenessCheck, Loaded  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LLAMA_1B = {  # meta-llama/Llama-3.2-1B's config.json, the fields outpace reads
    **LLAMA_8B,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "rope_scaling": {**LLAMA_8B["rope_scaling"], "factor": 32.0},
}
SHAPES = {"1b": LLAMA_1B, "8b": LLAMA_8B}


class _NoFinitenessCheck(FinitenessCheck):
    def add(self, loaded: Loaded) -> None:
        pass


@contextlib.contextmanager
def checks_off():
    """load_checkpoint without the dtype and finiteness checks (the file header checks stay)."""
    saved = checkpoint.FinitenessCheck, checkpoint.dtype_problem
    checkpoint.FinitenessCheck, checkpoint.dtype_problem = (
        _NoFinitenessCheck,
        lambda stored, param: None,
    )
    try:
        yield
    finally:
        checkpoint.FinitenessCheck, checkpoint.dtype_problem = saved


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_load(path: Path, dtype: torch.dtype, device: str, checked: bool) -> float:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    sync(device)
    start = time.perf_counter()
    with contextlib.nullcontext() if checked else checks_off():
        model = load_model(path, dtype, device, progress=False)
    sync(device)
    seconds = time.perf_counter() - start
    del model
    return seconds


def finiteness_alone(model: torch.nn.Module, device: str, reduction: str) -> float:
    """Seconds of the finiteness check over every parameter of a loaded model: ``sum`` (ours) or
    ``isfinite_all`` (torch.isfinite(t).all() per tensor, accumulated the same way)."""
    sync(device)
    start = time.perf_counter()
    if reduction == "sum":
        check = FinitenessCheck()
        for name, p in model.named_parameters():
            check.add(Loaded(name, Path(), p, p.dtype, lambda: None))
        assert check.problems() == []
    else:
        flags = [torch.isfinite(p).all() for p in model.parameters()]
        assert bool(torch.stack(flags).all())
    sync(device)
    return time.perf_counter() - start


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "runs_s": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["tinypy", *SHAPES], default="tinypy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=list(checkpoint.DTYPES), default="float32")
    parser.add_argument(
        "--repeats", type=int, default=3, help="loads with the checks and without, each"
    )
    parser.add_argument("--workdir", default="/tmp/outpace_load_check_cost")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = checkpoint.DTYPES[args.dtype]
    if args.shape == "tinypy":
        path = ROOT / "zoo" / "tinypy"
    else:
        gen_device = "cuda" if torch.cuda.is_available() else "cpu"
        path = random_target(Path(args.workdir) / args.shape, SHAPES[args.shape], device=gen_device)
    start = time.perf_counter()
    checkpoint.checkpoint_files(path)
    headers = time.perf_counter() - start
    timed_load(path, dtype, args.device, checked=True)  # warm-up: the page cache, lazy imports
    on, off = [], []
    for _ in range(args.repeats):
        on.append(timed_load(path, dtype, args.device, checked=True))
        off.append(timed_load(path, dtype, args.device, checked=False))
    model = load_model(path, dtype, args.device, progress=False)
    alone = {
        r: [finiteness_alone(model, args.device, r) for _ in range(args.repeats)]
        for r in ("sum", "isfinite_all")
    }
    result = {
        "shape": args.shape,
        "device": args.device,
        "dtype": args.dtype,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tensors": sum(1 for _ in model.parameters()),
        "checkpoint_bytes": sum(f.stat().st_size for f in checkpoint.checkpoint_files(path)),
        "header_checks_s": headers,
        "load_checked": summary(on),
        "load_unchecked": summary(off),
        "check_cost_median_s": statistics.median(on) - statistics.median(off),
        "finiteness_alone": {r: summary(t) for r, t in alone.items()},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
