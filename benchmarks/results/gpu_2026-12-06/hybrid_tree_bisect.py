"""Which switch makes the hybrids' EAGLE3-tree greedy tokens on the GPU equal the CPU's (gpu_2026-12-03 call 1 found them one
token short on the 40-token prompt: tests/kernels/test_hybrid_kernels.py::test_hybrid_greedy_tokens_on_the_gpu_equal_the_cpus).
Run from a checkout: python hybrid_tree_bisect.py VARIANT CASE [CASE ...]; prints a line a case."""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests")
from helpers.hybrid_models import make_hybrid, save_hybrid  # noqa: E402
from helpers.spec_models import make_eagle3_draft  # noqa: E402
from outpace import LLM, SamplingParams  # noqa: E402
from outpace.config import SpeculativeConfig  # noqa: E402


def no_fused_step():
    from outpace.layers.gated_deltanet import GatedDeltaNet
    from outpace.layers.mamba2 import Mamba2Mixer

    GatedDeltaNet.fused_step = False
    Mamba2Mixer.takes_fused_step = lambda self, x: False


def no_greedy_head():
    from outpace.models.nemotron_h import NemotronHForCausalLM
    from outpace.models.qwen3_next import Qwen3NextForCausalLM

    Qwen3NextForCausalLM.greedy_tokens = None
    NemotronHForCausalLM.greedy_tokens = None


def no_fused_rows():
    import outpace.layers.fused_decoder as fused_decoder

    fused_decoder.fusable_rows = lambda x, weight: False


TREE = dict(num_steps=3, topk=2, num_draft_tokens=6)
CASES = {  # name: (engine kwargs, speculative kwargs, a setup before the engine)
    "default": ({}, TREE, None),
    "chain": ({}, dict(num_steps=3), None),
    "no_run_ahead": (dict(run_ahead=False), TREE, None),
    "eager": (dict(cuda_graphs=False), TREE, None),
    "no_prefix_cache": (dict(enable_prefix_caching=False), TREE, None),
    "unchunked": (dict(max_num_batched_tokens=64), TREE, None),
    "torch_attention": (dict(attention_backend="torch"), TREE, None),
    "no_fused_step": ({}, TREE, no_fused_step),
    "no_greedy_head": ({}, TREE, no_greedy_head),
    "no_fused_rows": ({}, TREE, no_fused_rows),
}

variant, names = sys.argv[1], sys.argv[2:]
tmp = Path(tempfile.mkdtemp())
path = save_hybrid(make_hybrid(variant), tmp / variant)
eagle3 = make_eagle3_draft(path, tmp / "eagle3")
prompts = [[3, 17, 99, 100, 8, 42, 7], [5, 9], [(i * 7) % 131 for i in range(40)]]
params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
with LLM(str(path), device="cpu", block_size=4) as llm:
    cpu = [o.token_ids for o in llm.generate(prompts, params)]
for name in names:
    engine, spec, setup = CASES[name]
    if setup is not None:
        setup()
    kwargs = dict(device="cuda", dtype="float32", block_size=16, max_num_batched_tokens=16)
    with LLM(
        str(path),
        speculative=SpeculativeConfig("eagle3", str(eagle3), **spec),
        **{**kwargs, **engine},
    ) as llm:
        got = [o.token_ids for o in llm.generate(prompts, params)]
    verdict = [
        "ok" if g == c else f"BAD@{next(i for i, (a, b) in enumerate(zip(g, c)) if a != b)}"
        for g, c in zip(got, cpu)
    ]
    print(f"RESULT {variant} {name}: {' '.join(verdict)}", flush=True)
