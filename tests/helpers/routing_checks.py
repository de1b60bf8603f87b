"""Comparing two routings (weights, ids [tokens, top_k]) as sets of chosen experts per token."""

import torch


def by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) with each token's slots in expert order: the chosen set, whatever the order."""
    ids, order = ids.sort(dim=1)
    return weights.gather(1, order), ids


def assert_same_routing(got, expected) -> None:
    got_w, got_i = by_expert(*got)
    exp_w, exp_i = by_expert(*expected)
    assert torch.equal(got_i, exp_i.to(got_i.dtype))
    torch.testing.assert_close(got_w, exp_w, rtol=1e-5, atol=1e-6)
