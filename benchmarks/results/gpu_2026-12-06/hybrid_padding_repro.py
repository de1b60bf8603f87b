"""The GPU failure of tests/kernels/test_hybrid_kernels.py::test_hybrid_greedy_tokens_on_the_gpu_equal_the_cpus
(Qwen3-Next, EAGLE3 tree, 16-token budget) on the CPU: the test's engine with its prefill chunks replayed as a
captured prefill pads them (``capture_graphs()``; on the CPU the same code runs eagerly) and with gated
DeltaNet's fused step kernel (Triton's interpreter). NAN_EMPTY=1 fills every tensor that torch.empty,
empty_like or new_empty returns with NaN, so a read of memory nobody wrote shows. Cases: ``fused`` or ``plain``
(the torch path), ``_graphs`` for the captured prefill. Prints a line a case: ok or the first wrong token.

    PYTHONPATH=. [NAN_EMPTY=1] python3 benchmarks/results/gpu_2026-12-06/hybrid_padding_repro.py qwen3_next \
        fused_graphs plain_graphs fused"""

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

if os.environ.get("NAN_EMPTY"):
    _empty, _empty_like, _new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def _nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *a, **k: _nan(_empty(*a, **k))
    torch.empty_like = lambda *a, **k: _nan(_empty_like(*a, **k))
    torch.Tensor.new_empty = lambda self, *a, **k: _nan(_new_empty(self, *a, **k))

sys.path.insert(0, "tests")
from helpers.hybrid_models import make_hybrid, save_hybrid  # noqa: E402
from helpers.spec_models import make_eagle3_draft  # noqa: E402
from outpace import LLM, SamplingParams  # noqa: E402
from outpace.config import SpeculativeConfig  # noqa: E402
from outpace.layers.gated_deltanet import GatedDeltaNet  # noqa: E402

variant, cases = sys.argv[1], sys.argv[2:]
tmp = Path(tempfile.mkdtemp())
path = save_hybrid(make_hybrid(variant), tmp / variant)
eagle3 = make_eagle3_draft(path, tmp / "eagle3")
prompts = [[3, 17, 99, 100, 8, 42, 7], [5, 9], [(i * 7) % 131 for i in range(40)]]
params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
cpu = [o.token_ids for o in LLM(str(path), device="cpu", block_size=4).generate(prompts, params)]
tree = SpeculativeConfig("eagle3", str(eagle3), num_steps=3, topk=2, num_draft_tokens=6)
for case in cases:
    GatedDeltaNet.fused_step = case.startswith("fused")
    llm = LLM(
        str(path),
        device="cpu",
        dtype="float32",
        block_size=16,
        max_num_batched_tokens=16,
        speculative=tree,
    )
    if case.endswith("_graphs"):
        llm.engine.capture_graphs()
    got = [o.token_ids for o in llm.generate(prompts, params)]
    verdict = [
        "ok" if g == c else f"BAD@{next(i for i, (a, b) in enumerate(zip(g, c)) if a != b)}"
        for g, c in zip(got, cpu)
    ]
    print(f"RESULT {variant} {case}: {' '.join(verdict)}", flush=True)
