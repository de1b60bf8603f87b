"""outpace's Llama-family implementation against transformers on random weights (fp32, CPU)."""
import pytest
import torch

from hf_models import VARIANTS
from outpace import LLM, SamplingParams
from outpace.attention import build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.models.loader import load_model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant, hf_checkpoints):
    hf, path = hf_checkpoints(variant)
    model = load_model(path, torch.float32)
    ids = torch.randint(0, hf.config.vocab_size, (45,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        bind_kv_cache(model, BlockPool(8, 16), torch.float32, "cpu")
        meta = build_paged_metadata([[5, 2, 7]], [0], [45], 16, "cpu")
        with forward_context(meta):
            logits = model.compute_logits(model(ids, torch.arange(45)).hidden_states)
    rel = ((logits - ref).norm() / ref.norm()).item()
    assert rel < 1e-4, f"{variant}: relative error {rel}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_tokens_match_transformers(variant, hf_checkpoints):
    hf, path = hf_checkpoints(variant)
    prompt = [3, 17, 99, 150, 8, 42, 7]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    out = LLM(str(path), block_size=4, num_kv_blocks=64).generate([prompt], SamplingParams(
        temperature=0, max_tokens=32, ignore_eos=True))[0]
    assert out.token_ids == ref
