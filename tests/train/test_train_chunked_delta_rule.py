"""The chunked gated delta rule that trains hybrid targets (train/chunked_delta_rule.py) computes the per-token
loop's function (layers/gated_deltanet.py, the torch reference serving runs): outputs, final states and
gradients, over runs with padding, a starting state, grouped value heads, decays from none to total and a length
that is not a multiple of the chunk; inside its ``with`` block only forwards without recurrent metadata change
form."""

import pytest
import torch

from outpace.attention import DenseCausalMetadata, forward_context
from outpace.layers import gated_deltanet
from outpace.layers.gated_deltanet import GatedDeltaNet, gated_delta_rule_run
from outpace.layers.recurrent import RecurrentMetadata
from outpace.train.chunked_delta_rule import chunked_delta_rule, chunked_delta_rule_in_training


def inputs(seed: int, runs=3, length=150, k_heads=2, v_heads=4, k_dim=8, v_dim=6):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(runs, length, k_heads, k_dim, generator=g) for _ in range(2))
    v = torch.randn(runs, length, v_heads, v_dim, generator=g)
    # per value head: a decay of about 1, 0.6, 0.05 and 2e-9 per token
    log_decay = -torch.rand(runs, length, v_heads, generator=g) * torch.tensor(
        [0.01, 0.5, 3.0, 20.0]
    )
    beta = torch.rand(runs, length, v_heads, generator=g)
    state = torch.randn(runs, v_heads, k_dim, v_dim, generator=g)
    valid = torch.arange(length) < torch.tensor([length, 100, 37])[:, None]
    return q, k, v, log_decay, beta, state, valid


@pytest.mark.parametrize("chunk", [64, 16])
def test_chunked_equals_the_per_token_loop(chunk):
    q, k, v, g, beta, state, valid = inputs(0)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta, state)]
    loop_out, loop_final, _ = gated_delta_rule_run(
        q, k, v, g, beta, state, valid, None, False, kernel=False
    )
    out, final = chunked_delta_rule(q, k, v, g, beta, state, valid, chunk=chunk)
    keep = valid[..., None, None]
    assert torch.allclose(out * keep, loop_out * keep, atol=1e-5)
    assert torch.allclose(final, loop_final, atol=1e-5)
    weights = torch.randn_like(out) * keep  # a loss over the real tokens and the final state
    grads = [
        torch.autograd.grad((o * weights).sum() + f.square().sum(), leaves)
        for o, f in ((loop_out, loop_final), (out, final))
    ]
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_only_forwards_without_recurrent_metadata_change_form():
    layer = GatedDeltaNet(
        32,
        num_k_heads=2,
        num_v_heads=4,
        head_k_dim=8,
        head_v_dim=6,
        conv_width=4,
        eps=1e-6,
        activation="silu",
        packed_by_key_head=False,
    )
    x = torch.randn(2 * 70, 32, generator=torch.Generator().manual_seed(1))
    engine = RecurrentMetadata(
        state_indices=torch.tensor([0, 1]), has_initial_state=torch.tensor([False, False])
    )
    with torch.no_grad(), forward_context(DenseCausalMetadata(2, 70)):
        served = layer(x)
        with chunked_delta_rule_in_training():
            chunked = layer(x)
            with forward_context(DenseCausalMetadata(2, 70), recurrent=engine):
                as_served = layer(x)
    assert gated_deltanet.gated_delta_rule_run is gated_delta_rule_run  # restored
    assert torch.allclose(chunked, served, atol=1e-5)
    assert not torch.equal(chunked, served)  # the chunked form ran
    assert torch.equal(as_served, served)  # an engine forward (state slots) ran the served loop
