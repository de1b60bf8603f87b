"""MixtralForCausalLM's config: every field of transformers' MixtralConfig implemented (another value changes the
model built), irrelevant to inference, or refused by name; speculation over it is lossless. Its outputs against
transformers: tests/models/test_parity.py (variants mixtral, mixtral-window); under tensor and expert parallelism:
tests/distributed/test_tensor_parallel_families.py, test_expert_parallel.py."""

import pytest
import transformers

from helpers.config_walk import COMMON_IRRELEVANT, TEXT_MODEL_IMPLEMENTED, built, walk_fields
from helpers.spec_models import make_eagle3_draft
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.validation import ConfigError

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
)
IRRELEVANT = COMMON_IRRELEVANT | {
    "output_router_logits",
    "router_aux_loss_coef",  # training losses
    "router_jitter_noise",  # MixtralSparseMoeBlock jitters the router's input in training only
}
IMPLEMENTED = {
    **TEXT_MODEL_IMPLEMENTED,
    "sliding_window": (16, {}),
    "num_local_experts": (6, {}),
    "num_experts_per_tok": (3, {}),
}


def base() -> dict:
    return {
        **transformers.MixtralConfig(**SMALL).to_dict(),
        "architectures": ["MixtralForCausalLM"],
    }


def test_every_field_is_implemented_or_irrelevant():
    walk_fields("MixtralConfig", base(), IMPLEMENTED, IRRELEVANT)


@pytest.mark.parametrize(
    "field,value",
    [("num_experts_per_tok", 5), ("num_local_experts", 0), ("sliding_window", 0)],
)
def test_bad_mixture_fields_are_refused_by_name(field, value):
    with pytest.raises(ConfigError, match=field):
        built({**base(), field: value})
    with pytest.raises(ConfigError, match="llama_4_scaling_beta"):
        rope = {"rope_theta": 1e6, "rope_type": "default", "llama_4_scaling_beta": 0.1}
        built({**base(), "rope_parameters": rope})


def test_speculation_over_mixtral_is_lossless(hf_checkpoints, tmp_path):
    """n-gram and an EAGLE3 chain over the Mixtral target: its greedy tokens alone."""
    _, path = hf_checkpoints("mixtral")
    prompts = [[3, 17, 99, 150, 8, 42, 7, 3, 17, 99], [5, 6, 7, 5, 6, 7, 5]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in LLM(str(path), block_size=4).generate(prompts, params)]
    draft = make_eagle3_draft(path, tmp_path / "eagle3")
    for spec in (
        SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
        SpeculativeConfig("eagle3", str(draft), num_steps=3),
    ):
        outs = LLM(str(path), block_size=4, speculative=spec).generate(prompts, params)
        assert [o.token_ids for o in outs] == plain, spec.method
