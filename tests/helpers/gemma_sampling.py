"""Sampling on tiny Gemma 3 and Gemma 4 targets (helpers/gemma_models.py's with a 12-token vocabulary, so that
random drafts are accepted now and then): the targets, the sampling parameters, an engine for many samples,
and the chi-square check of the first three tokens against the target's exact joint."""

import torch
import transformers

from helpers.gemma_models import (
    GEMMA3_TEXT,
    GEMMA4_TEXT,
    GEMMA4_UNIFIED_TEXT,
    make_every_weight_matter,
    random_gemma,
)
from helpers.hf_models import save_hf_model
from helpers.stats import chi_square_p_value
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

VOCAB, TRIALS = 12, 3000
PARAMS = SamplingParams(temperature=0.8, top_k=3, max_tokens=3, ignore_eos=True)
# softcapping at 0.5 would leave nearly uniform distributions: a wrong sampler could hide in them
GEMMA3_TINY = dict(GEMMA3_TEXT, vocab_size=VOCAB, final_logit_softcapping=3.0)
GEMMA4_TINY = dict(
    GEMMA4_TEXT, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0
)
GEMMA4_UNIFIED_TINY = dict(GEMMA4_UNIFIED_TEXT, vocab_size=VOCAB, final_logit_softcapping=3.0)
# the five GEMMA4_TINY layers are [sliding, sliding, full, sliding, full]: an assistant reads layers 3 and 4's KV
GEMMA4_ASSISTANT_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
GEMMA4_PROMPT = [
    3,
    1,
    9,
    10,
    8,
    4,
    7,
    3,
    1,
    9,
    10,
    8,
    6,
    5,
    2,
    11,
    0,
]  # 17 tokens: over two windows of 7
CONFIGS = {
    "gemma3": lambda: transformers.Gemma3TextConfig(**GEMMA3_TINY),
    "gemma4": lambda: transformers.Gemma4TextConfig(**GEMMA4_TINY),
    "gemma4-unified": lambda: transformers.Gemma4UnifiedTextConfig(**GEMMA4_UNIFIED_TINY),
}


def make_tiny_gemma(variant: str, path):
    """The small-vocabulary target, saved under ``path`` -> (transformers model, path)."""
    model = random_gemma(CONFIGS[variant]())
    return model, save_hf_model(model, path)


def make_gemma4_assistant(ordered: bool = False, seed: int = 1, unified: bool = False, **text):
    """A 3-layer assistant (hidden 32, 3 heads) for GEMMA4_TINY (``text``: its text config's changes); ordered: 4
    clusters of 3 tokens, 2 scored; unified: Gemma4UnifiedAssistantForCausalLM over a Gemma4UnifiedTextConfig
    (gemma-4-12B's assistant)."""
    t = GEMMA4_TINY
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"],
        global_head_dim=t["global_head_dim"],
        max_position_embeddings=128,
        sliding_window=t["sliding_window"],
        layer_types=GEMMA4_ASSISTANT_TYPES,
        rope_parameters=t["rope_parameters"],
    )
    if unified:
        text_config = transformers.Gemma4UnifiedTextConfig(**fields, **text)
        config_class = transformers.Gemma4UnifiedAssistantConfig
        model_class = transformers.Gemma4UnifiedAssistantForCausalLM
    else:
        text_config = transformers.Gemma4TextConfig(
            **{**fields, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, **text}
        )
        config_class = transformers.Gemma4AssistantConfig
        model_class = transformers.Gemma4AssistantForCausalLM
    cfg = config_class(
        text_config=text_config,
        backbone_hidden_size=t["hidden_size"],
        use_ordered_embeddings=ordered,
        num_centroids=4,
        centroid_intermediate_top_k=2,
    )
    torch.manual_seed(seed)
    model = model_class(cfg).eval()
    make_every_weight_matter(model)
    with torch.no_grad():
        for p in model.parameters():  # larger weights: drafts that depend on their inputs
            if p.dim() == 2:
                p.mul_(3.0)
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(VOCAB))
    return model


def assert_follows_the_joint(
    llm: LLM, prompt: list[int], joint: torch.Tensor, min_accepted: float
) -> None:
    outs = llm.generate([prompt] * TRIALS, PARAMS)
    emitted = torch.tensor([o.token_ids for o in outs])  # [TRIALS, 3]
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]
    p = chi_square_p_value(torch.bincount(index, minlength=VOCAB**3), TRIALS * joint)
    assert p > 1e-3, f"p = {p:.2e}"
    accepted = sum(o.spec_metrics.num_accepted_drafts for o in outs)
    assert accepted > min_accepted * TRIALS, f"{accepted} drafts accepted: speculation hardly ran"


def sampling_llm(target_dir, spec: SpeculativeConfig) -> LLM:
    return LLM(
        str(target_dir),
        block_size=4,
        num_kv_blocks=4096,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        seed=11,
        speculative=spec,
    )
