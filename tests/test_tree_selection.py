"""Choosing a draft tree's nodes (speculative/tree.py) deterministically."""
import torch

from outpace.attention.context import forward_settings
from outpace.speculative.tree import top_k


def test_ties_go_to_the_lower_index_in_batch_invariant_mode():
    """top_k in batch-invariant mode: a stable order among equal values, the same for a row alone or in a
    batch (torch.topk's tie order on CUDA depends on its algorithm, which the number of rows picks)."""
    row = torch.tensor([0.5, 2.0, 1.0, 2.0, 1.0, 1.0])
    with forward_settings(True):
        values, indices = top_k(row[None], 4)
        assert indices.tolist() == [[1, 3, 2, 4]] and values.tolist() == [[2.0, 2.0, 1.0, 1.0]]
        batch = torch.stack([row.flip(0), row, row[[1, 0, 2, 3, 4, 5]]])
        assert top_k(batch, 4)[1][1].tolist() == [1, 3, 2, 4]
    values, indices = top_k(row[None], 2)  # outside the mode: torch.topk (its tie order unspecified)
    assert values.tolist() == [[2.0, 2.0]] and sorted(indices[0].tolist()) == [1, 3]
