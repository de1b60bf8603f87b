"""Verification of draft tokens against the target, as pure functions.

Terms
-----
- position / node 0: the last accepted token (already committed, not a draft). The target's distribution at position
  j (``target_*[:, j]``) is for the token *after* position j. In a chain, position j >= 1 holds draft ``j - 1``; in
  a tree, node j >= 1 holds ``draft_token_ids[:, j]``.
- ``num_correct_drafts``: drafts accepted (the longest accepted prefix / root path).
- bonus token: the one token the target adds after the last correct draft. When every draft on the path was accepted
  it is sampled from the target at the last accepted node (vLLM's "bonus"); when a draft was rejected it is sampled
  from the residual at the rejection point (vLLM's "recovered"). Either way exactly one per request, so accepted
  tokens per verify = ``num_correct_drafts + 1``.
- ``last_correct_step_indices``: the verified position/node whose state must survive (KV, recurrent state):
  ``num_correct_drafts`` for a chain, the accepted node for a tree.

Greedy verification compares drafts with ``argmax`` of the target. Sampling verification is speculative (rejection)
sampling and is exactly lossless: the emitted tokens have the target's processed distribution
(``outpace.layers.sampler.logits_to_probs``). Rows whose target distribution is one-hot (temperature 0) reduce to
the greedy rule: a draft equal to the argmax is always accepted, any other always rejected, and the bonus token is
the argmax. Randomness comes from per-row random keys (``outpace.layers.sampler.random_keys``, or the default RNG
without them): the uniforms are stream 0 of a row's key, the bonus token's draw stream 1, so a request reproduces
whatever the batch looks like.

Seeded rows (``outpace.layers.sampler``'s module docstring) are verified by exact matching: given each node's
noise (``gumbel``: that of the position the node decides, shared by the nodes of one depth), a seeded row's
target distribution at the node is the point mass at its Gumbel-max sample, so the rule above reduces to the greedy
one against those samples, whatever the draft probabilities: the longest path of drafts equal to the target's own
samples is kept and the bonus token is its sample after that path. The output is then the token sequence plain
decoding samples with the same noise: it does not depend on the drafts.

Nothing here syncs with the host; shapes depend only on input shapes. Chain functions are fully vectorised; tree
functions loop over depth (greedy) or over nodes (sampling), with every step vectorised over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from outpace.layers.argmax import argmax_last
from outpace.layers.sampler import (
    Keys,
    SamplingTensors,
    draw_uniform,
    logits_to_probs,
    sample_from_probs,
)


@dataclass
class VerifyResult:
    """Outcome of one verify step for a batch of requests.

    ``L`` is ``num_drafts + 1`` for a chain and ``max_depth + 1`` for a tree.
    """

    output_token_ids: Tensor  # [batch, L] int64: accepted drafts, then the bonus token, then -1
    num_correct_drafts: Tensor  # [batch] int64
    bonus_token_ids: Tensor  # [batch] int64: == output_token_ids[b, num_correct_drafts[b]]
    last_correct_step_indices: Tensor  # [batch] int64: chain position / tree node to keep state at
    # [batch, L] int64: verified positions/nodes kept, starting with 0 (the last accepted
    # token), one per accepted draft, then -1. Chain: 0..num_correct_drafts.
    accepted_path: Tensor

    @property
    def num_accepted_tokens(self) -> Tensor:
        """Tokens committed by this verify (accepted drafts + bonus).  # [batch]"""
        return self.num_correct_drafts + 1


# ----------------------------------------------------------------------------------------
# Rejection-sampling primitives (module level so tests can swap in broken variants).


def _accepts(uniform: Tensor, p_x: Tensor, q_x: Tensor | float) -> Tensor:
    """Accept with probability min(1, p(x) / q(x)), as ``u * q(x) < p(x)``.  # [batch] bool

    Division-free; with ``u`` in [0, 1): p(x) >= q(x) always accepts, p(x) == 0 never.
    """
    return uniform * q_x < p_x


def _residual_after_rejection(p: Tensor, q: Tensor) -> Tensor:
    """normalize(max(0, p - q)); falls back to ``p`` where that is all zero.  # [batch, V]

    The fallback only matters for p == q, where rejection has probability 0.
    """
    residual = (p - q).clamp(min=0.0)  # [batch, V]
    total = residual.sum(dim=-1, keepdim=True)  # [batch, 1]
    normalised = residual / total.clamp(min=torch.finfo(residual.dtype).tiny)  # [batch, V]
    return torch.where(total > 0, normalised, p)


def _residual_after_rejecting_token(p: Tensor, token: Tensor) -> Tensor:
    """p with ``token`` removed, renormalised: the residual for a one-hot proposal q.
    Falls back to ``p`` where nothing is left (then the rejection had probability 0).
    ``p``  # [batch, V]; ``token``  # [batch]; returns  # [batch, V]"""
    residual = p.scatter(-1, token[:, None], 0.0)  # [batch, V]
    total = residual.sum(dim=-1, keepdim=True)  # [batch, 1]
    normalised = residual / total.clamp(min=torch.finfo(residual.dtype).tiny)  # [batch, V]
    return torch.where(total > 0, normalised, p)


# ----------------------------------------------------------------------------------------
# Chains: draft_token_ids [batch, num_drafts], target distributions [batch, num_drafts + 1, V].


def _chain_result(
    draft_token_ids: Tensor, num_correct_drafts: Tensor, bonus_token_ids: Tensor
) -> VerifyResult:
    num_drafts = draft_token_ids.shape[1]
    if (
        num_drafts == 0
    ):  # plain decoding: the bonus token alone, at position 0 (a few kernels fewer per step)
        return VerifyResult(
            bonus_token_ids[:, None],
            num_correct_drafts,
            bonus_token_ids,
            num_correct_drafts,
            num_correct_drafts[:, None],
        )
    positions = torch.arange(num_drafts + 1, device=draft_token_ids.device)  # [L]
    n = num_correct_drafts[:, None]  # [batch, 1]
    drafts = F.pad(draft_token_ids, (0, 1), value=-1)  # [batch, L]
    output = torch.where(positions < n, drafts, -1)  # [batch, L]
    output = torch.where(positions == n, bonus_token_ids[:, None], output)  # [batch, L]
    accepted_path = torch.where(positions <= n, positions, -1)  # [batch, L]
    return VerifyResult(
        output, num_correct_drafts, bonus_token_ids, num_correct_drafts, accepted_path
    )


def verify_greedy_chain(draft_token_ids: Tensor, target_logits: Tensor) -> VerifyResult:
    """Greedy chain verification: keep the longest prefix equal to the target's argmax.

    ``draft_token_ids``  # [batch, num_drafts]
    ``target_logits``    # [batch, num_drafts + 1, V] (logits or probs: only argmax is used)
    """
    return accept_greedy_chain(draft_token_ids, argmax_last(target_logits))


def accept_greedy_chain(draft_token_ids: Tensor, target_predict: Tensor) -> VerifyResult:
    """:func:`verify_greedy_chain` from the target's argmax ``target_predict`` [batch, num_drafts + 1] int64 (a
    model's ``greedy_tokens``: the argmax without the logits)."""
    if draft_token_ids.shape[1] == 0:  # plain decoding: the argmax is the bonus, no gather launched
        bonus = target_predict[:, 0]  # [batch]
        return _chain_result(draft_token_ids, torch.zeros_like(bonus), bonus)
    if target_predict.is_cuda:  # the whole result in one launch (speculative/tree_kernels.py)
        from outpace.speculative import tree_kernels

        output, correct, bonus, path = tree_kernels.greedy_chain(draft_token_ids, target_predict)
        return VerifyResult(output, correct, bonus, correct, path)
    draft_token_ids = draft_token_ids.long()
    matches = draft_token_ids == target_predict[:, :-1]  # [batch, num_drafts]
    num_correct_drafts = matches.long().cumprod(dim=1).sum(dim=1)  # [batch]
    bonus = target_predict.gather(1, num_correct_drafts[:, None]).squeeze(1)  # [batch]
    return _chain_result(draft_token_ids, num_correct_drafts, bonus)


def verify_sampling_chain(
    draft_token_ids: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    keys: Keys = None,
    uniform_rand: Tensor | None = None,
) -> VerifyResult:
    """Speculative sampling over a chain (Leviathan et al. / Chen et al.).

    ``draft_token_ids``  # [batch, num_drafts]: draft j was proposed from q_j
    ``draft_probs``      # [batch, num_drafts, V] q, or None (see below)
    ``target_probs``     # [batch, num_drafts + 1, V] p, processed by ``logits_to_probs``
    ``keys``: per-row random keys (or None: the default RNG) for the uniforms and the bonus token.
    ``uniform_rand``     # [batch, num_drafts] optional explicit U[0, 1) numbers.

    Draft j (token x) is accepted with probability min(1, p_j(x) / q_j(x)); drafts after the first rejection are
    discarded. At the first rejection j the bonus token is sampled from normalize(max(0, p_j - q_j)); if all drafts
    are accepted, from p_{num_drafts}. Lossless when each draft j was sampled from q_j given the drafts before it.

    ``draft_probs=None``: q_j is taken as the one-hot at the draft token (deterministic proposers: n-gram, greedy
    drafts). Then x is accepted with probability p_j(x) and the residual is p_j with x removed. This is lossless for
    any drafts chosen without looking at this function's random numbers (conditioned on the drafts the output is
    exactly p), at the price of lower acceptance than passing the true q of sampled drafts.
    """
    draft_token_ids = draft_token_ids.long()
    batch, num_drafts = draft_token_ids.shape
    device = draft_token_ids.device
    rows = torch.arange(batch, device=device)  # [batch]

    p_draft = (
        target_probs[:, :num_drafts].gather(-1, draft_token_ids[..., None]).squeeze(-1)
    )  # [batch, num_drafts]
    # [batch, num_drafts]; 1.0: the one-hot q of deterministic drafts
    q_draft = (
        1.0
        if draft_probs is None
        else draft_probs.gather(-1, draft_token_ids[..., None]).squeeze(-1)
    )
    if uniform_rand is None:
        uniform_rand = draw_uniform(batch, num_drafts, keys, device)  # [batch, num_drafts]
    accepted = _accepts(uniform_rand, p_draft, q_draft)  # [batch, num_drafts]
    num_correct_drafts = accepted.long().cumprod(dim=1).sum(dim=1)  # [batch]

    next_probs = target_probs[rows, num_correct_drafts]  # [batch, V]
    if num_drafts > 0:
        rejected_at = num_correct_drafts.clamp(max=num_drafts - 1)  # [batch]
        if draft_probs is None:
            residual = _residual_after_rejecting_token(
                next_probs, draft_token_ids[rows, rejected_at]
            )  # [batch, V]
        else:
            residual = _residual_after_rejection(
                next_probs, draft_probs[rows, rejected_at]
            )  # [batch, V]
        rejected = num_correct_drafts < num_drafts  # [batch]
        next_probs = torch.where(rejected[:, None], residual, next_probs)  # [batch, V]
    bonus = sample_from_probs(next_probs, keys)  # [batch]
    return _chain_result(draft_token_ids, num_correct_drafts, bonus)


# ----------------------------------------------------------------------------------------
# Trees: parent [batch, num_nodes] (-1 for node 0), draft_token_ids [batch, num_nodes] (node 0's entry unused), target
# distributions [batch, num_nodes, V]. Nodes are in topological order (parent index < child index); siblings are
# tried in index order.


def _tree_result(
    draft_token_ids: Tensor,
    accepted_path: Tensor,
    num_correct_drafts: Tensor,
    bonus_token_ids: Tensor,
) -> VerifyResult:
    path_nodes = accepted_path[:, 1:]  # [batch, max_depth]
    tokens = draft_token_ids.gather(1, path_nodes.clamp(min=0))  # [batch, max_depth]
    tokens = torch.where(path_nodes >= 0, tokens, -1)  # [batch, max_depth]
    output = F.pad(tokens, (0, 1), value=-1)  # [batch, max_depth + 1]
    output = output.scatter(
        1, num_correct_drafts[:, None], bonus_token_ids[:, None]
    )  # [batch, max_depth + 1]
    last_node = accepted_path.gather(1, num_correct_drafts[:, None]).squeeze(1)  # [batch]
    return VerifyResult(output, num_correct_drafts, bonus_token_ids, last_node, accepted_path)


def verify_greedy_tree(
    parent: Tensor, draft_token_ids: Tensor, target_logits: Tensor, max_depth: int | None = None
) -> VerifyResult:
    """Greedy tree verification: from the root, repeatedly move to the child whose token is the target's argmax at the
    current node (the lowest-index one if several); stop when no child matches. The bonus token is the argmax at the
    last accepted node.

    ``parent``           # [batch, num_nodes] int64, -1 for node 0
    ``draft_token_ids``  # [batch, num_nodes], node 0 unused
    ``target_logits``    # [batch, num_nodes, V] (logits or probs)
    ``max_depth``: an upper bound on the tree depth (default ``num_nodes - 1``); it fixes the loop count and the width
    ``max_depth + 1`` of the outputs.
    """
    return accept_greedy_tree(parent, draft_token_ids, argmax_last(target_logits), max_depth)


def accept_greedy_tree(
    parent: Tensor, draft_token_ids: Tensor, target_predict: Tensor, max_depth: int | None = None
) -> VerifyResult:
    """:func:`verify_greedy_tree` from the target's argmax ``target_predict`` [batch, num_nodes] int64."""
    parent, draft_token_ids = parent.long(), draft_token_ids.long()
    batch, num_nodes = parent.shape
    device = parent.device
    max_depth = num_nodes - 1 if max_depth is None else max_depth
    nodes = torch.arange(num_nodes, device=device)  # [num_nodes]
    if target_predict.is_cuda:  # the same walk in one launch (speculative/tree_kernels.py)
        from outpace.speculative import tree_kernels

        return _tree_result(
            draft_token_ids,
            *tree_kernels.greedy_walk(parent, draft_token_ids, target_predict, max_depth),
        )
    current = torch.zeros(batch, dtype=torch.int64, device=device)  # [batch]
    num_correct_drafts = torch.zeros(batch, dtype=torch.int64, device=device)  # [batch]
    accepted_path = F.pad(
        current[:, None], (0, max_depth), value=-1
    )  # [batch, max_depth + 1]: node 0, then -1
    for depth in range(1, max_depth + 1):
        wanted = target_predict.gather(1, current[:, None])  # [batch, 1]
        is_match = (parent == current[:, None]) & (draft_token_ids == wanted)  # [batch, num_nodes]
        child = torch.where(is_match, nodes, num_nodes).amin(dim=1)  # [batch]; num_nodes = none
        found = child < num_nodes  # [batch]; once False it stays False (current is unchanged)
        current = torch.where(found, child, current)
        num_correct_drafts = num_correct_drafts + found
        accepted_path[:, depth] = torch.where(found, child, -1)
    bonus = target_predict.gather(1, current[:, None]).squeeze(1)  # [batch]
    return _tree_result(draft_token_ids, accepted_path, num_correct_drafts, bonus)


def verify_sampling_tree(
    parent: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    keys: Keys = None,
    uniform_rand: Tensor | None = None,
    max_depth: int | None = None,
) -> VerifyResult:
    """Multi-candidate recursive rejection sampling over a draft tree (SpecInfer style).

    ``parent``           # [batch, num_nodes] int64, -1 for node 0; topological order
    ``draft_token_ids``  # [batch, num_nodes], node 0 unused
    ``draft_probs``      # [batch, num_nodes, V]: q at node u, from which u's children were
                         # drawn; or None for deterministically chosen children (below)
    ``target_probs``     # [batch, num_nodes, V]: p at node u, processed by logits_to_probs
    ``uniform_rand``     # [batch, num_nodes - 1] optional; column j - 1 decides node j
    ``max_depth``: upper bound on the tree depth (default ``num_nodes - 1``); outputs have width ``max_depth + 1``. A
    deeper tree is a caller error.

    At the current node u: r <- p_u. Try u's children in index order; child c with token x is accepted with
    probability min(1, r(x) / q_u(x)), and then u <- c and we start again at c. On rejection
    r <- normalize(max(0, r - q_u)) and the next child is tried. When every child is rejected (or u is a leaf), the
    bonus token is sampled from r.

    When lossless:
    - ``draft_probs`` given: lossless when, given the path to u, the children of u are i.i.d. samples from q_u (with
      replacement; duplicate tokens allowed) and their number does not depend on the sampled values. Each child's
      subtree may depend on that child. Deterministic top-k children (EAGLE trees) do NOT satisfy this: use None.
    - ``draft_probs=None``: each child is treated as a one-hot proposal: accept token x with probability r(x); on
      rejection remove x from r and renormalise. Lossless for any tree built without this function's random numbers
      (top-k, n-gram, beam, sampled drafts): conditioned on the tree, the emitted tokens have exactly the target
      distribution.

    Cost: a loop over the ``num_nodes - 1`` nodes, each step O(batch * V), because siblings must be tried one after
    another (each rejection changes r).
    """
    parent, draft_token_ids = parent.long(), draft_token_ids.long()
    batch, num_nodes = parent.shape
    device = parent.device
    max_depth = num_nodes - 1 if max_depth is None else max_depth
    depths = torch.arange(max_depth + 1, device=device)  # [max_depth + 1]
    if uniform_rand is None:
        uniform_rand = draw_uniform(batch, num_nodes - 1, keys, device)  # [batch, num_nodes - 1]

    current = torch.zeros(batch, dtype=torch.int64, device=device)  # [batch]
    num_correct_drafts = torch.zeros(batch, dtype=torch.int64, device=device)  # [batch]
    accepted_path = F.pad(
        current[:, None], (0, max_depth), value=-1
    )  # [batch, max_depth + 1]: node 0, then -1
    residual = target_probs[:, 0]  # [batch, V]: r at the current node
    draft_q = (
        None if draft_probs is None else draft_probs[:, 0]
    )  # [batch, V]: q at the current node
    for node in range(1, num_nodes):
        tried = parent[:, node] == current  # [batch]
        token = draft_token_ids[:, node]  # [batch]
        r_token = residual.gather(1, token[:, None]).squeeze(1)  # [batch]
        if draft_q is None:
            accepted = tried & _accepts(uniform_rand[:, node - 1], r_token, 1.0)  # [batch]
            after_rejection = _residual_after_rejecting_token(residual, token)  # [batch, V]
        else:
            q_token = draft_q.gather(1, token[:, None]).squeeze(1)  # [batch]
            accepted = tried & _accepts(uniform_rand[:, node - 1], r_token, q_token)  # [batch]
            after_rejection = _residual_after_rejection(residual, draft_q)  # [batch, V]
            draft_q = torch.where(accepted[:, None], draft_probs[:, node], draft_q)  # [batch, V]
        rejected = tried & ~accepted  # [batch]
        residual = torch.where(rejected[:, None], after_rejection, residual)  # [batch, V]
        residual = torch.where(accepted[:, None], target_probs[:, node], residual)  # [batch, V]
        current = torch.where(accepted, node, current)
        num_correct_drafts = num_correct_drafts + accepted
        write = accepted[:, None] & (
            depths == num_correct_drafts[:, None]
        )  # [batch, max_depth + 1]
        accepted_path = torch.where(write, node, accepted_path)
    bonus = sample_from_probs(residual, keys)  # [batch]
    return _tree_result(draft_token_ids, accepted_path, num_correct_drafts, bonus)


# ----------------------------------------------------------------------------------------
# Entry points from target logits and per-request sampling params.


def _target_probs(target_logits: Tensor, st: SamplingTensors, gumbel: Tensor | None) -> Tensor:
    """Process per-request ``target_logits`` [batch, positions, V] with ``st`` (one row
    per request) and, for seeded rows, ``gumbel`` [batch, positions, V].  # [batch, positions, V] float32"""
    batch, positions, vocab = target_logits.shape
    flat = target_logits.reshape(batch * positions, vocab)  # [batch * positions, V]
    noise = (
        None if gumbel is None else gumbel.reshape(batch * positions, vocab)
    )  # [batch * positions, V]
    return logits_to_probs(flat, st.repeat_interleave(positions), noise).view(
        batch, positions, vocab
    )


def verify_chain(
    draft_token_ids: Tensor,
    draft_probs: Tensor | None,
    target_logits: Tensor,
    st: SamplingTensors,
    keys: Keys = None,
    gumbel: Tensor | None = None,
) -> VerifyResult:
    """Greedy verification when every request is greedy (``st.all_greedy``, a host bool),
    else speculative sampling on the processed target distribution, exact matching for seeded
    rows (module docstring). ``st`` has one row per request; ``gumbel`` [batch, num_drafts + 1, V]:
    the noise of the position each node decides; other shapes as in :func:`verify_sampling_chain`
    with raw ``target_logits``."""
    if st.all_greedy:
        return verify_greedy_chain(draft_token_ids, target_logits)
    return verify_sampling_chain(
        draft_token_ids, draft_probs, _target_probs(target_logits, st, gumbel), keys
    )


def verify_tree(
    parent: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor | None,
    target_logits: Tensor,
    st: SamplingTensors,
    keys: Keys = None,
    gumbel: Tensor | None = None,
    max_depth: int | None = None,
) -> VerifyResult:
    """Tree counterpart of :func:`verify_chain` (``gumbel`` [batch, num_nodes, V])."""
    if st.all_greedy:
        return verify_greedy_tree(parent, draft_token_ids, target_logits, max_depth)
    target_probs = _target_probs(target_logits, st, gumbel)
    return verify_sampling_tree(
        parent, draft_token_ids, draft_probs, target_probs, keys, max_depth=max_depth
    )
