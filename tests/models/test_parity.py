"""outpace's Llama-family implementation against transformers on random weights (fp32, CPU)."""

import pytest
import torch

from helpers.hf_models import SMALL as SMALL_FIELDS
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


def test_ministral3_scales_each_query_by_its_position(tmp_path):
    """Ministral 3's ``llama_4_scaling_beta``: q times 1 + beta ln(1 + floor(position / original length)). With
    q_proj sharpened so that the attention's temperature shows (without the scaling, transformers' own logits
    move by more than 1%), prefill logits and greedy tokens, decode steps past several of the scale's steps
    included, equal transformers'."""
    import copy

    from helpers.hf_models import make_hf_model, save_hf_model

    hf = make_hf_model("ministral3")
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
    path = save_hf_model(hf, tmp_path / "ministral3")
    vocab = hf.config.vocab_size
    unscaled = copy.deepcopy(hf)
    unscaled.config.rope_parameters["llama_4_scaling_beta"] = 0.0
    ids = torch.arange(40)[None] * 5 % vocab
    with torch.no_grad():
        logits, without = hf(ids).logits, unscaled(ids).logits
    assert ((logits - without).norm() / logits.norm()).item() > 1e-2
    assert paged_prefill_error(hf, path, vocab) < 1e-4
    prompt = [3, 17, 99, 150, 8, 42, 7]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
            eos_token_id=None, pad_token_id=0,
        )[0, len(prompt) :].tolist()  # fmt: skip
    out = LLM(str(path), block_size=4, num_kv_blocks=64).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    )[0]
    assert out.token_ids == ref


def test_ministral3_text_configs_default_to_full_attention():
    """Ministral3Config's sliding_window defaults to None where MistralConfig's is 4096: a Ministral 3 text config
    without the field has no window; a family without the query scaling refuses its beta by name."""
    from outpace.model_config import ModelConfig
    from outpace.validation import ConfigError

    text = dict(VARIANTS["ministral3"][1], **SMALL_FIELDS, model_type="ministral3")
    ours = ModelConfig.from_dict({**text, "architectures": ["Ministral3ForCausalLM"]})
    assert ours.layer_windows == () and ours.query_scaling == (0.5, 8)
    mistral = ModelConfig.from_dict({**SMALL_FIELDS, "architectures": ["MistralForCausalLM"]})
    assert mistral.layer_windows == (4096,) * SMALL_FIELDS["num_hidden_layers"]
    with pytest.raises(ConfigError, match="rope_parameters.llama_4_scaling_beta"):
        ModelConfig.from_dict({**text, "architectures": ["Qwen3ForCausalLM"]})
