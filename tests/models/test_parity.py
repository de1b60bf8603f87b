"""outpace's Llama-family implementation against transformers on random weights (fp32, CPU)."""

import pytest
import torch

from helpers.hf_models import VARIANTS, paged_prefill_error
from outpace import LLM, SamplingParams


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant, hf_checkpoints):
    hf, path = hf_checkpoints(variant)
    rel = paged_prefill_error(hf, path, hf.config.get_text_config().vocab_size)
    assert rel < 1e-4, f"{variant}: relative error {rel}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_tokens_match_transformers(variant, hf_checkpoints):
    hf, path = hf_checkpoints(variant)
    prompt = [3, 17, 99, 150, 8, 42, 7]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=32,
            do_sample=False,
            min_new_tokens=32,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    out = LLM(str(path), block_size=4, num_kv_blocks=64).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    )[0]
    assert out.token_ids == ref
