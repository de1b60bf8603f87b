"""What holds GPU memory after bench/families.py's run_shape closed its engines (call 1: 1.1-1.3 GB stayed
allocated after each shrunk shape of tests/bench/test_family_shapes.py). Prints the allocated bytes, the live
CUDA tensors and graphs by size, and for the largest the chain of objects that refer to them."""

import gc
import sys
import tempfile
from pathlib import Path

import torch

from outpace.bench.families import run_shape
from outpace.bench.family_shapes import FamilyShape, family_shapes, shrink


def describe(obj) -> str:
    if isinstance(obj, dict):
        keys = list(obj)[:6]
        return f"dict{keys}"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__}[{len(obj)}]"
    return type(obj).__module__ + "." + type(obj).__qualname__


def chain(obj, depth=4) -> list[str]:
    out, seen, frontier = [], {id(obj)}, [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            for r in gc.get_referrers(o):
                if id(r) in seen or r is frontier or r is nxt or type(r).__name__ == "frame":
                    continue
                seen.add(id(r))
                nxt.append(r)
        out.append(" | ".join(describe(r) for r in nxt[:5]))
        frontier = nxt[:5]
    return out


name = sys.argv[1] if len(sys.argv) > 1 else "deepseek-v2-lite"
shape = family_shapes()[name]
tiny = FamilyShape(name, shape.source, shrink(shape.config, shape.tiny_layers), 99, 1)
before = torch.cuda.memory_allocated()
run_shape(tiny, Path(tempfile.mkdtemp()), bandwidth=3e12)
gc.collect()
torch.cuda.synchronize()
after = torch.cuda.memory_allocated()
torch._C._cuda_clearCublasWorkspaces()
cleared = torch.cuda.memory_allocated()
print(
    f"MEM {name}: before {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB, "
    f"after clearing cuBLAS's workspaces {cleared / 2**20:.1f} MiB"
)
tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
graphs = [o for o in gc.get_objects() if isinstance(o, torch.cuda.CUDAGraph)]
total = sum(t.untyped_storage().nbytes() for t in tensors)
print(
    f"MEM live CUDA tensors {len(tensors)} ({total / 2**20:.1f} MiB of storage), CUDA graphs {len(graphs)}"
)
for t in sorted(tensors, key=lambda t: -t.untyped_storage().nbytes())[:4]:
    print(f"MEM tensor {tuple(t.shape)} {t.dtype} {t.untyped_storage().nbytes() / 2**20:.1f} MiB")
    for level in chain(t):
        print("MEM   <-", level)
for g in graphs[:2]:
    print("MEM graph")
    for level in chain(g):
        print("MEM   <-", level)
