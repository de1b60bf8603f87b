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


def test_a_qwen2_vl_hub_config_reads_its_mrope_sections_as_plain_rope(hf_checkpoints):
    """The hub's Qwen2.5-VL configs give ``rope_scaling: {"type": "mrope", "mrope_section": ...}`` (transformers 5
    writes rope_type default beside it): read as the default RoPE, as transformers' Qwen2VLTextConfig reads it, and
    served the same."""
    import json

    from outpace.model_config import ModelConfig

    _, path = hf_checkpoints("qwen2.5-vl-multimodal")
    written = json.loads((path / "config.json").read_text())
    text = {k: v for k, v in written["text_config"].items() if k != "rope_parameters"}
    text.update(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, rope_theta=1e6)
    hub, ours = (
        ModelConfig.from_dict({**written, "text_config": text}),
        ModelConfig.from_dict(written),
    )
    assert hub.rope_scaling is None and (hub.rope_theta, hub.head_dim) == (
        ours.rope_theta,
        ours.head_dim,
    )


def test_qwen2_moe_windows_without_layer_types_follow_transformers():
    """A Qwen2-MoE config without ``layer_types`` (the hub's predate them): the layers transformers' config makes
    sliding (odd counts before max_window_layers, with use_sliding_window) are the ones that slide."""
    import transformers

    from outpace.model_config import ModelConfig

    fields = dict(VARIANTS["qwen2-moe-window"][1], num_hidden_layers=6, max_window_layers=4)
    written = {
        **transformers.Qwen2MoeConfig(**fields).to_dict(),
        "architectures": ["Qwen2MoeForCausalLM"],
    }
    types = written.pop("layer_types")
    assert "full_attention" in types and "sliding_attention" in types
    expected = tuple(8 if t == "sliding_attention" else None for t in types)
    assert ModelConfig.from_dict(written).layer_windows == expected
