"""Sampling with EAGLE3 drafts on Gemma 3 and Gemma 4 targets (fp32, CPU, random weights): the first three
tokens the engine emits follow the target's exact joint distribution (chi-square), for chains and trees.
The targets are helpers/gemma_models.py's (sliding windows of 7, softcapping, Gemma 4's per-layer embeddings)
with a 12-token vocabulary (helpers/gemma_sampling.py), so that random drafts are accepted now and then; the
prompt is longer than the window."""

import pytest

from helpers.gemma_sampling import (
    CONFIGS,
    PARAMS,
    VOCAB,
    assert_follows_the_joint,
    make_tiny_gemma,
    sampling_llm,
)
from helpers.spec_models import make_eagle3_draft
from helpers.stats import exact_joint
from outpace.config import SpeculativeConfig

PROMPT = [3, 1, 9, 10, 8, 4, 7, 3, 1, 6]  # 10 tokens: past the window of 7
SHAPES = {"chain": dict(num_steps=3), "tree": dict(num_steps=3, topk=2, num_draft_tokens=6)}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """variant -> (target directory, its exact joint, an EAGLE3 draft directory)."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            root = tmp_path_factory.mktemp(variant)
            _, path = make_tiny_gemma(variant, root / "target")
            draft = make_eagle3_draft(
                path,
                root / "eagle3",
                draft_vocab_size=10,
                aux_ids=[1, 2, 4],
                seed=3,
                use_aux_norm=True,
                target_model_type="gemma3_text",
            )
            cache[variant] = (path, exact_joint(path, PROMPT, PARAMS, VOCAB), draft)
        return cache[variant]

    return get


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_eagle3_sampling_follows_the_target_distribution(variant, shape, gemma):
    path, joint, draft = gemma(variant)
    llm = sampling_llm(path, SpeculativeConfig("eagle3", str(draft), **SHAPES[shape]))
    assert_follows_the_joint(llm, PROMPT, joint, 0.05)
