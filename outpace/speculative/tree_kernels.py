"""Draft-tree bookkeeping as single Triton launches, for the GPU: the ancestor mask, the greedy walk
down a verified tree, and a greedy chain's whole verify result (a chain is the tree whose node i hangs from
node i - 1: its eager form is some eighteen small torch kernels after the argmax, about 33 us of an MTP step of the
widened Qwen3.5 on the H200, benchmarks/results/gpu_2026-12-02 call 3). speculative/tree.py and speculative/verify.py keep the torch code, which the CPU
runs and tests compare against (tests/kernels/test_tree_kernels.py); on the GPU each of their depth loops cost
some 8 tiny launches per level, about 0.15 ms of an 8B-shaped batch-1 tree step on the H100
(benchmarks/scripts/diag_spec_step.py). One program serves one request's tree or chain."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ancestor_mask_kernel(parents, mask, n, MAX_DEPTH: tl.constexpr, BN: tl.constexpr):
    r = tl.program_id(0)
    nodes = tl.arange(0, BN)
    valid = nodes < n
    allowed = nodes[:, None] == nodes[None, :]  # [BN, BN] itself
    current = tl.load(parents + r * n + nodes, mask=valid, other=-1)  # one step up
    for _ in tl.static_range(MAX_DEPTH):
        up = current >= 0
        allowed = allowed | ((nodes[None, :] == current[:, None]) & up[:, None])
        current = tl.where(up, tl.load(parents + r * n + current, mask=up, other=-1), current)
    inside = valid[:, None] & valid[None, :]
    tl.store(
        mask + r * n * n + nodes[:, None] * n + nodes[None, :], allowed.to(tl.int8), mask=inside
    )


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """speculative/tree.ancestor_mask.  parents [batch, n] -> [batch, n, n] bool"""
    batch, n = parents.shape
    mask = torch.empty(batch, n, n, dtype=torch.int8, device=parents.device)
    _ancestor_mask_kernel[(batch,)](
        parents.long().contiguous(), mask, n, MAX_DEPTH=max_depth, BN=triton.next_power_of_2(n)
    )
    return mask.view(torch.bool)


@triton.jit
def _pick(values, nodes, node):
    """values[node] of a [BN] vector, for a scalar node."""
    return tl.sum(tl.where(nodes == node, values, 0), axis=0)


@triton.jit
def _greedy_walk_kernel(
    parents,
    tokens,
    predict,
    path_out,
    correct_out,
    bonus_out,
    n,
    MAX_DEPTH: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
):
    r = tl.program_id(0)
    nodes = tl.arange(0, BN)
    valid = nodes < n
    par = tl.load(parents + r * n + nodes, mask=valid, other=-2)
    tok = tl.load(tokens + r * n + nodes, mask=valid, other=-1)
    pred = tl.load(predict + r * n + nodes, mask=valid, other=-1)
    cols = tl.arange(0, BD)
    path = tl.where(cols == 0, 0, -1).to(tl.int64)  # [BD]: node 0, then -1
    current = tl.full((), 0, tl.int64)
    correct = tl.full((), 0, tl.int64)
    for depth in tl.static_range(1, MAX_DEPTH + 1):
        wanted = _pick(pred, nodes, current)
        match = valid & (par == current) & (tok == wanted)
        child = tl.min(tl.where(match, nodes, BN), axis=0)  # the lowest matching child
        found = child < BN  # once False, stays False
        path = tl.where((cols == depth) & found, child, path)
        current = tl.where(found, child, current)
        correct += found.to(tl.int64)
    tl.store(path_out + r * (MAX_DEPTH + 1) + cols, path, mask=cols < MAX_DEPTH + 1)
    tl.store(correct_out + r, correct)
    tl.store(bonus_out + r, _pick(pred, nodes, current))


def greedy_walk(
    parents: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_predict: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """speculative/verify.verify_greedy_tree's walk.  parents, draft_token_ids, target_predict [batch, n]
    -> (accepted_path [batch, max_depth + 1], num_correct_drafts [batch], bonus_token_ids [batch])."""
    batch, n = parents.shape
    dev = parents.device
    path = torch.empty(batch, max_depth + 1, dtype=torch.int64, device=dev)
    correct = torch.empty(batch, dtype=torch.int64, device=dev)
    bonus = torch.empty(batch, dtype=torch.int64, device=dev)
    _greedy_walk_kernel[(batch,)](
        parents.long().contiguous(),
        draft_token_ids.long().contiguous(),
        target_predict.long().contiguous(),
        path,
        correct,
        bonus,
        n,
        MAX_DEPTH=max_depth,
        BN=triton.next_power_of_2(n),
        BD=triton.next_power_of_2(max_depth + 1),
    )
    return path, correct, bonus


@triton.jit
def _greedy_chain_kernel(
    drafts,  # [batch, D] the draft tokens (any integer dtype)
    draft_stride,
    predict,  # [batch, D + 1] int64 the target's argmax at each position
    predict_stride,
    output_out,  # [batch, D + 1] int64: the accepted drafts, the bonus, then -1
    path_out,  # [batch, D + 1] int64: positions 0 .. a, then -1
    correct_out,  # [batch] int64 a
    bonus_out,  # [batch] int64
    num_drafts,
    BL: tl.constexpr,
):
    r = tl.program_id(0)
    cols = tl.arange(0, BL)
    is_draft = cols < num_drafts
    tok = tl.load(drafts + r * draft_stride + cols, mask=is_draft, other=-1).to(tl.int64)
    pred = tl.load(predict + r * predict_stride + cols, mask=cols <= num_drafts, other=-1)
    # the first position whose draft is not the argmax (past the drafts: all matched)
    correct = tl.min(tl.where(is_draft & (tok == pred), BL, cols), axis=0).to(tl.int64)
    bonus = _pick(pred, cols, correct)
    output = tl.where(cols < correct, tok, tl.where(cols == correct, bonus, -1))
    width = cols <= num_drafts
    tl.store(output_out + r * (num_drafts + 1) + cols, output, mask=width)
    tl.store(
        path_out + r * (num_drafts + 1) + cols, tl.where(cols <= correct, cols, -1), mask=width
    )
    tl.store(correct_out + r, correct)
    tl.store(bonus_out + r, bonus)


def greedy_chain(
    draft_token_ids: torch.Tensor, target_predict: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """speculative/verify.verify_greedy_chain after its argmax.  draft_token_ids [batch, D], target_predict
    [batch, D + 1] int64 -> (output_token_ids [batch, D + 1], num_correct_drafts [batch], bonus_token_ids
    [batch], accepted_path [batch, D + 1]) as verify.VerifyResult holds them."""
    batch, num_drafts = draft_token_ids.shape
    dev = draft_token_ids.device
    drafts = draft_token_ids if draft_token_ids.stride(1) == 1 else draft_token_ids.contiguous()
    predict = target_predict if target_predict.stride(1) == 1 else target_predict.contiguous()
    output = torch.empty(batch, num_drafts + 1, dtype=torch.int64, device=dev)
    path = torch.empty(batch, num_drafts + 1, dtype=torch.int64, device=dev)
    correct = torch.empty(batch, dtype=torch.int64, device=dev)
    bonus = torch.empty(batch, dtype=torch.int64, device=dev)
    _greedy_chain_kernel[(batch,)](
        drafts,
        drafts.stride(0),
        predict,
        predict.stride(0),
        output,
        path,
        correct,
        bonus,
        num_drafts,
        BL=triton.next_power_of_2(num_drafts + 1),
    )
    return output, correct, bonus, path
