"""Batch-invariant mode on the CPU (the eager MoE path): every token's output of Qwen3-Next's sparse MoE (its
router, experts and sigmoid-gated shared expert) has the same bits alone and among many tokens, in any order. The CPU's element-wise ops run a vector loop and a scalar tail that round differently (a sigmoid of
[n, 1] gates: its elements fall in the one or the other by the token count), so the mode computes those a
token at a time (layers/recurrent.py ``rows_alone``)."""

import pytest
import torch

from helpers.hybrid_models import make_hybrid, save_hybrid
from outpace.attention.context import forward_settings
from outpace.layers.gated_shared_moe import SparseMoeWithSharedExpert
from outpace.models.loader import load_model

TOKENS = 37  # past any vector width, and not a multiple of one


@pytest.fixture(scope="module")
def qwen3_next_moe(tmp_path_factory) -> SparseMoeWithSharedExpert:
    path = save_hybrid(make_hybrid("qwen3_next"), tmp_path_factory.mktemp("qwen3_next"))
    model = load_model(path, torch.float32, "cpu", progress=False)
    return next(m for m in model.modules() if isinstance(m, SparseMoeWithSharedExpert))


def test_a_tokens_sparse_moe_output_does_not_depend_on_the_batch(qwen3_next_moe):
    hidden = qwen3_next_moe.shared_expert_gate.weight.shape[1]
    x = torch.randn(TOKENS, hidden, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), forward_settings(batch_invariant=True):
        alone = torch.cat([qwen3_next_moe(row) for row in x.split(1)])  # each token alone
        among = qwen3_next_moe(x)
        reversed_ = qwen3_next_moe(x.flip(0)).flip(0)
    assert torch.equal(among, alone)
    assert torch.equal(reversed_, alone)
