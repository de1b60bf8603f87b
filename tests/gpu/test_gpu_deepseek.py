"""GPU-only (skipped without CUDA): a small DeepSeek target (MLA over the latent cache + MoE) runs its decode
iteration as captured CUDA graphs, with the MLA kernel and the grouped-expert kernels inside, and gives in
fp32 the tokens of the same engine run eagerly and of the eager torch attention path; speculation (n-gram
chains) stays lossless with graphs. Shapes as tests/helpers/deepseek_models.py's (kv_lora_rank 36, vocab 203, expert
groups, dense first layers), V2 and V3 routing."""

from __future__ import annotations

import pytest
import torch

from helpers.deepseek_models import make_hf_deepseek
from helpers.hf_models import save_hf_model
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

PROMPTS = [
    [1, 5, 2, 7, 3],
    [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2, 17, 40, 33, 2, 9, 11, 3, 101, 7],
    list(range(13)) * 2,
    [200, 3],
]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
KWARGS = dict(device="cuda", dtype="float32", max_num_seqs=4, num_kv_blocks=128, block_size=4)


@pytest.fixture(scope="module", params=["v2-group", "v3-yarn"])
def target(request, tmp_path_factory):
    return str(
        save_hf_model(make_hf_deepseek(request.param), tmp_path_factory.mktemp(request.param))
    )


def tokens(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.gpu
def test_captured_decode_equals_eager_fp32(target):
    graphed = LLM(target, **KWARGS)
    iteration = graphed.engine.runner.decode_step
    assert iteration.graphs and all(call.graph is not None for call in iteration.graphs.values())
    replays, run = [], iteration.run
    iteration.run = lambda key, *args: replays.append(key in iteration.graphs) or run(key, *args)
    got = tokens(graphed)
    assert len(replays) > 5 and all(
        replays
    )  # every decode step a replay: nothing in the forward syncs
    assert got == tokens(LLM(target, cuda_graphs=False, **KWARGS))  # the same kernels, eagerly
    assert got == tokens(
        LLM(target, cuda_graphs=False, attention_backend="torch", **KWARGS)
    )  # torch MLA
    assert graphed.engine.pool.num_free == 128


@pytest.mark.gpu
def test_captured_speculation_is_lossless_fp32(target):
    plain = tokens(LLM(target, cuda_graphs=False, attention_backend="torch", **KWARGS))
    llm = LLM(target, speculative=SpeculativeConfig("ngram", num_steps=3, ngram_min=1), **KWARGS)
    assert all(call.graph is not None for call in llm.engine.runner.decode_step.graphs.values())
    assert tokens(llm) == plain


@pytest.mark.gpu
def test_moe_layers_take_the_grouped_kernels_on_cuda(target, monkeypatch):
    import outpace.layers.grouped_experts as launcher  # layers/moe.py imports it at each call

    calls = []
    real = launcher.grouped_experts
    monkeypatch.setattr(
        launcher, "grouped_experts", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
    )
    LLM(target, cuda_graphs=False, **KWARGS).generate(PROMPTS[:1], GREEDY.replace(max_tokens=3))
    assert calls and torch.cuda.is_available()
