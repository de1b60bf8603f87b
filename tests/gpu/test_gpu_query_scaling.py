"""GPU-only (skipped without CUDA): Ministral 3's query scaling by position (layers/rotary.py ``query_scale``) on the
fused few-row path, where one kernel projects, rotates and writes the cache and the scale follows it
(layers/fused_decoder.py ``project_fused``): captured decode in float32 past several of the scale's steps gives the
CPU's greedy tokens, as does plain Mistral's."""

from __future__ import annotations

import pytest

from helpers.fused_rows import take_the_fused_path_in_fp32
from helpers.hf_models import make_hf_model, save_hf_model
from outpace import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = [[3, 17, 99, 150, 8, 42, 7], [5, 9], [(i * 7) % 203 for i in range(29)]]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["ministral3", "mistral"])
def test_the_fused_path_scales_queries_as_the_cpu(variant, tmp_path, monkeypatch):
    import torch

    hf = make_hf_model(variant)
    with torch.no_grad():  # attention sharp enough that the scale changes the tokens
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
    path = str(save_hf_model(hf, tmp_path))
    fused = take_the_fused_path_in_fp32(monkeypatch)
    kwargs = dict(device="cuda", dtype="float32", max_num_seqs=4, num_kv_blocks=64, block_size=16)
    got = [o.token_ids for o in LLM(path, **kwargs).generate(PROMPTS, GREEDY)]
    assert fused  # the decode steps took the fused path
    cpu = LLM(path, device="cpu", block_size=16).generate(PROMPTS, GREEDY)
    assert got == [o.token_ids for o in cpu]
