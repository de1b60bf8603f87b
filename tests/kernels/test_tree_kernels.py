"""The GPU's tree bookkeeping (speculative/tree_kernels.py: compiled on a GPU, else in Triton's
interpreter) equals the torch code the CPU runs: the ancestor mask, and greedy tree verification's walk
(path, accepted drafts, bonus), on random topologically ordered trees where the target agrees with some
branches; and greedy chain verification's whole result."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.speculative import tree, tree_kernels, verify  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _random_trees(batch: int, n: int, vocab: int, seed: int):
    """parents [batch, n] (each node's parent an earlier node), tokens [batch, n], the target's argmax
    [batch, n] (it picks one child's token at about half of the nodes), and the deepest depth."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    depth = torch.zeros(batch, n, dtype=torch.int64)
    for i in range(1, n):
        parents[:, i] = (torch.rand(batch, generator=g) * i).long()
        depth[:, i] = depth.gather(1, parents[:, i : i + 1]).squeeze(1) + 1
    tokens = torch.randint(0, vocab, (batch, n), generator=g)
    predict = torch.randint(0, vocab, (batch, n), generator=g)
    for b in range(batch):
        for u in range(n):
            children = (parents[b] == u).nonzero().flatten()
            if len(children) and torch.rand(1, generator=g) < 0.7:
                predict[b, u] = tokens[b, children[-1]]
    return parents, tokens, predict, int(depth.max())


@pytest.mark.parametrize("n, seed", [(16, 0), (7, 1), (33, 2)])
def test_ancestor_mask_kernel(n, seed):
    parents, _, _, max_depth = _random_trees(6, n, 5, seed)
    want = tree.ancestor_mask(parents, max_depth)
    assert torch.equal(tree_kernels.ancestor_mask(parents.to(DEVICE), max_depth).cpu(), want)
    assert not torch.equal(
        tree_kernels.ancestor_mask(parents.to(DEVICE), max_depth - 1).cpu(), want
    )


@pytest.mark.parametrize("n, seed", [(16, 0), (7, 1), (33, 2)])
def test_greedy_walk_kernel(n, seed):
    parents, tokens, predict, max_depth = _random_trees(6, n, 3, seed)
    logits = torch.nn.functional.one_hot(predict, 3).float()
    want = verify.verify_greedy_tree(parents, tokens, logits, max_depth)
    path, correct, bonus = (
        t.cpu()
        for t in tree_kernels.greedy_walk(
            parents.to(DEVICE), tokens.to(DEVICE), predict.to(DEVICE), max_depth
        )
    )
    assert torch.equal(path, want.accepted_path)
    assert torch.equal(correct, want.num_correct_drafts)
    assert torch.equal(bonus, want.bonus_token_ids)
    assert (correct > 0).any() and (correct < max_depth).any()


@pytest.mark.parametrize("num_drafts", [1, 2, 3, 5, 8])
def test_greedy_chain_kernel(num_drafts):
    """Every row's first rejection at each position (and none), drafts in int32 as well as int64."""
    g = torch.Generator().manual_seed(num_drafts)
    batch, vocab = num_drafts + 2, 7
    predict = torch.randint(0, vocab, (batch, num_drafts + 1), generator=g)
    drafts = predict[:, :-1].clone()
    for r in range(num_drafts + 1):  # row r rejects its draft r first (row num_drafts: none)
        if r < num_drafts:
            drafts[r, r] = (predict[r, r] + 1) % vocab
    drafts[-1] = torch.randint(0, vocab, (num_drafts,), generator=g)  # a random row
    logits = torch.nn.functional.one_hot(predict, vocab).float()  # argmax = predict
    want = verify.verify_greedy_chain(drafts, logits)  # the torch code
    for dtype in (torch.int64, torch.int32):
        output, correct, bonus, path = tree_kernels.greedy_chain(
            drafts.to(dtype).to(DEVICE), predict.to(DEVICE)
        )
        assert torch.equal(correct.cpu(), want.num_correct_drafts)
        assert torch.equal(correct.cpu()[: num_drafts + 1], torch.arange(num_drafts + 1))
        assert torch.equal(bonus.cpu(), want.bonus_token_ids)
        assert torch.equal(output.cpu(), want.output_token_ids)
        assert torch.equal(path.cpu(), want.accepted_path)
