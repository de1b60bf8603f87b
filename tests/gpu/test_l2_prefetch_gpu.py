"""layers/l2_prefetch.py on the GPU: the captured decode steps of every fused attention path (Llama's, MLA's,
Gemma's sandwich, Qwen3.5's gated attention) hold their o_proj prefetches on the side stream, and a prefetch
changes no bit: tokens and log-probabilities equal those of the same engine built with prefetching off."""

import json
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.layers import l2_prefetch, l2_prefetch_kernel

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def _generate(model: str):
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
    llm = LLM(str(ZOO / model), device="cuda", dtype="bfloat16", max_num_seqs=4)
    return [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)]


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["tinypy", "tinyds", "tinygemma", "tinyqwen35"])
def test_prefetching_o_proj_changes_no_bit(model, monkeypatch):
    spans = []
    launch = l2_prefetch_kernel.prefetch_span
    monkeypatch.setattr(
        l2_prefetch_kernel,
        "prefetch_span",
        lambda t, fraction: (spans.append(t.data_ptr()), launch(t, fraction)),
    )
    monkeypatch.setattr(l2_prefetch, "enabled", True)
    with_prefetch = _generate(model)
    assert spans, "no o_proj prefetch was issued (nor captured)"
    monkeypatch.setattr(l2_prefetch, "enabled", False)
    count = len(spans)
    without = _generate(model)
    assert len(spans) == count
    assert with_prefetch == without
