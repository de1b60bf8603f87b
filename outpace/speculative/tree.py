"""Draft trees on the device: chains, ancestor masks, and EAGLE-2-style node selection."""

from __future__ import annotations

import torch

from outpace.layers.sampler import SamplingTensors, gumbel_scores, logits_to_probs

# (num_nodes, device) -> [num_nodes + 1] int64 -1, 0, .., num_nodes - 1: what every chain of that size shares
_CHAIN_NODES: dict[tuple[int, torch.device], torch.Tensor] = {}


def chain_tree(batch: int, num_nodes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents, depths), each [batch, num_nodes], of a chain: node i's parent is i - 1. Read-only views of one
    tensor per size and device, made by the first call and kept (a captured step reads it, and building them
    took two launches a step); that first call must be eager, as layers/zeroed_scratch.py's: a tensor made
    inside a CUDA graph capture holds nothing until the graph replays."""
    device = torch.device(device)
    key = (num_nodes, device)
    if key not in _CHAIN_NODES:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"speculative/tree.py: a chain of {num_nodes} nodes on {device} is made by an eager call "
                "first: draft once before capturing"
            )
        _CHAIN_NODES[key] = torch.arange(-1, num_nodes, device=device)
    nodes = _CHAIN_NODES[key]
    return nodes[:-1].expand(batch, -1), nodes[1:].expand(batch, -1)


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[batch, n, n] bool: node i may attend to node j iff j is i or an ancestor of i.

    parents [batch, n] (-1 for the root). ``max_depth`` bounds the walk (no host sync needed).
    """
    if parents.is_cuda:  # the same walk in one launch (speculative/tree_kernels.py)
        from outpace.speculative import tree_kernels

        return tree_kernels.ancestor_mask(parents, max_depth)
    batch, n = parents.shape
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(batch, n, n).clone()
    current = parents  # [batch, n]: the ancestor one more step up, -1 past the root
    for _ in range(max_depth):
        valid = current >= 0
        mask |= torch.nn.functional.one_hot(current.clamp(min=0), n).bool() & valid[..., None]
        current = torch.where(valid, torch.gather(parents, 1, current.clamp(min=0)), current)
    return mask


def select_tree(
    scores: torch.Tensor,
    tokens: torch.Tensor,
    parent_candidate: torch.Tensor,
    depths: torch.Tensor,
    root_tokens: torch.Tensor,
    num_nodes: int,
):
    """Keep the ``num_nodes - 1`` best candidates by cumulative log-probability (EAGLE-2).

    Candidates [batch, C] are listed parents-first; parent_candidate is -1 for the root's
    children. A child's score never exceeds its parent's (log-probs are <= 0) and ties go to the
    shallower node, so every kept node's parent is kept too. Returns (token_ids, parents, depths),
    each [batch, num_nodes], node 0 the root, nodes in candidate (topological) order.
    """
    batch, num_candidates = scores.shape
    keyed = scores - 1e-6 * depths.float()
    chosen = keyed.topk(num_nodes - 1, dim=1).indices.sort(dim=1).values  # [batch, num_nodes - 1]
    node_of = torch.full((batch, num_candidates), -1, dtype=torch.int64, device=scores.device)
    node_of.scatter_(1, chosen, torch.arange(1, num_nodes, device=scores.device).expand(batch, -1))
    parent_cand = torch.gather(parent_candidate, 1, chosen)
    parent_node = torch.where(
        parent_cand < 0, 0, torch.gather(node_of, 1, parent_cand.clamp(min=0))
    )
    root = torch.zeros(batch, 1, dtype=torch.int64, device=scores.device)
    token_ids = torch.cat([root_tokens[:, None], torch.gather(tokens, 1, chosen)], dim=1)
    parents = torch.cat([root - 1, parent_node], dim=1)
    node_depths = torch.cat([root, torch.gather(depths, 1, chosen)], dim=1)
    return token_ids, parents, node_depths


def tree_log_probs(
    logits: torch.Tensor, st: SamplingTensors, gumbel: torch.Tensor | None
) -> torch.Tensor:
    """The log-probabilities a tree drafter ranks each node's children by, [n, V] from draft ``logits`` [n, V]:
    the draft's own (``log_softmax``), or for a seeded row (layers/sampler.py) those of its perturbed
    distribution, ``log_softmax(log q + G)`` (q: the draft's distribution processed by the row's parameters;
    ``gumbel`` [n, V]: the noise of the children's position, None when no row is seeded). A seeded row's best
    child is then its Gumbel-max sample under the draft (the chain's draft), the next ones the runners-up,
    and a candidate's cumulative score still never exceeds its parent's."""
    logp = torch.log_softmax(logits, dim=-1)  # [n, V]
    if gumbel is None:
        return logp
    perturbed = torch.log_softmax(
        gumbel_scores(logits_to_probs(logits, st), gumbel), dim=-1
    )  # [n, V]
    return torch.where(st.seeded[:, None], perturbed, logp)
