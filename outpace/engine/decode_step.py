"""THE decode iteration, written once: propose -> verify forward -> accept -> KV commit -> drafter update.

One step advances every request of a decode batch by one verify, reading and writing only device
state (the request row, engine/request_table.py, and the drafter's row buffers), with shapes fixed by
(batch bucket, ``DraftShape``, sampling mode: ``SamplingMode``). On CUDA each such key is captured
once as a CUDA graph and replayed; elsewhere, and for a batch no bucket holds, the same function
runs eagerly. Plain decoding is the zero-draft case: node 0 alone, whose verify samples the next
token. A zero-draft step whose key holds (engine/step_key.py) does not call the drafter's ``draft``:
the drafter's ``hold`` appends the step's committed row to its pending rows instead of its ``update``
(speculative/proposer.py), so the step costs what plain decoding costs.

Let L be a request's KV length; its last token sits at position L with no KV yet. The drafts form a
tree whose node 0 is that token and whose node i sits at position L + depth(i) in KV row L + i. The
target forwards all nodes; acceptance (greedy, rejection sampling, or for seeded requests exact
matching against the target's own samples: speculative/verify.py) keeps ``a`` drafts along one root
path and adds the bonus token; a tree's path is then moved to rows L .. L + a (a chain's already is),
the request's length becomes L + a + 1 and its last token the bonus. Rows past the path are left
behind: the next forward overwrites them. The node at depth d decides the token at position L + 1 + d,
and a seeded request's randomness there is a function of its seed and that position alone
(layers/sampler.py), as for the token a prefill samples at the end of a prompt (engine/prefill.py).

What a step does to the target's logits before verifying them, and what it reports besides tokens, is
the key's ``LogitsFeatures``: penalties and logit biases at every node (the node's path counted as
output), a grammar's masks (a drafting step's computed on the host from its drafts between its two captured
parts, ``MaskedStepCall``; a zero-draft step's written before it launches), the raw log-probabilities of
the committed tokens. Keys without any are captured at start-up, the others when a batch first needs them
(engine/runner.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

from outpace.cache.kv_cache import CacheRows
from outpace.cache.recurrent_states import RecurrentStates
from outpace.engine.cuda_graphs import CapturedCall
from outpace.engine.request_table import RequestTable
from outpace.engine.step_key import StepKey
from outpace.host_copies import pinned
from outpace.layers.logits_processing import (
    TokenLogprobs,
    apply_token_bitmask,
    count_tokens,
    token_logprobs,
)
from outpace.request import VERIFY
from outpace.speculative.chain import chain_drafts, position_gumbel
from outpace.speculative.proposer import DecodeRows, Drafts, DraftShape, Proposer, Verified
from outpace.speculative.tree import ancestor_mask
from outpace.speculative.verify import (
    VerifyResult,
    accept_greedy_chain,
    accept_greedy_tree,
    verify_chain,
    verify_tree,
)


class StepRows(NamedTuple):
    """A step's outputs by request (``DecodeStep.unpack``): column[i] is request i's."""

    tokens: list[list[int]]  # committed: the accepted drafts and the bonus
    accepted: list[int]  # accepted drafts
    depths: list[list[int]] | None  # a tree's drafts' depths; None for a chain
    logprobs: (
        list[list[tuple]] | None
    )  # per committed token: (logprob, rank, top ids, top logprobs)


# The host's part of a grammar step: the draft trees -> each row's token bitmask at every node, written into
# ``DecodeStep.grammar_masks[:b, :num_nodes]`` ([b, num_nodes, words] int32) and returned.
TokenMasks = Callable[[Drafts], torch.Tensor]


class Forwarded(NamedTuple):
    """A step's first part (``DecodeStep.draft_and_forward``), which its second reads."""

    rows: DecodeRows
    drafts: Drafts
    tree_mask: torch.Tensor | None  # [b, n, n] a tree's ancestors (None for a chain)
    out: object  # the target's forward: hidden_states [b * n, hidden], aux_hidden_states
    recurrent: object  # hybrid models' per-node states (RecurrentStates.verify), committed after the verify


class DecodeStep:
    def __init__(
        self,
        model: nn.Module,
        backend,
        kv_caches: list,
        req_table: RequestTable,
        proposer: Proposer | None,
        max_seqs: int,
        states: RecurrentStates,
    ) -> None:
        """``states``: the indices' recurrent state (hybrid models; empty otherwise), kept at the last
        correct node of each verify (``RecurrentStates.commit``)."""
        self.model, self.backend, self.states = model, backend, states
        self.req_table, self.proposer = req_table, proposer
        self.kv_rows = CacheRows(kv_caches)
        # The step's input: each row's row (padding rows: the padding row). Static, so captured
        # graphs read it; the host writes it before each launch (``set_rows``).
        self.batch_indices = torch.full(
            (max_seqs,), req_table.padding_index, dtype=torch.int64, device=req_table.device
        )
        # Grammar masks [max_seqs, max nodes, words] int32 the step reads where it is given no ``token_masks``
        # (with structured output: ``use_grammar_masks``): a zero-draft step's follow from the committed tokens
        # alone, so the host writes them before the launch; a drafting step's from its drafts, so the host
        # writes them between its two captured parts (``MaskedStepCall``).
        self.grammar_masks: torch.Tensor | None = None
        # what set_rows wrote last, and batch_indices' version counter after it (None: write again)
        self._rows_written: list[int] = []
        self._version_written: int | None = None
        # the captured steps (CUDA; eager replays elsewhere)
        self.graphs: dict[StepKey, CapturedCall | MaskedStepCall] = {}

    def use_grammar_masks(self, nodes: int, words: int) -> None:
        """Structured output is on: allocate ``grammar_masks`` for up to ``nodes`` nodes a row, bitmasks of
        ``words`` int32 words."""
        rows = self.batch_indices.shape[0]
        self.grammar_masks = torch.full(
            (rows, nodes, words), -1, dtype=torch.int32, device=self.batch_indices.device
        )

    def capture(self, key: StepKey, memory_pool=None) -> None:
        """Capture the step of this key (on CUDA; elsewhere the replay runs it eagerly)."""
        if key.features.grammar and key.shape.num_steps:
            self.graphs[key] = MaskedStepCall(self, key, memory_pool)
        else:
            self.graphs[key] = CapturedCall(
                lambda: self.step(key), self.req_table.device, memory_pool
            )

    def set_rows(self, req_indices: list[int], bucket: int) -> None:
        """Write a step's rows into ``batch_indices[:bucket]`` (``req_indices`` then the padding row), unless it
        holds them already: consecutive steps of one batch copy nothing (on the GPU a pinned host tensor and a
        copy fewer a step). Any other write to ``batch_indices`` bumps its version counter, which makes the next
        call write again."""
        padded = req_indices + [self.req_table.padding_index] * (bucket - len(req_indices))
        indices, version = self.batch_indices, _version(self.batch_indices)
        if (
            version is not None
            and version == self._version_written
            and padded == self._rows_written
        ):
            return
        indices[:bucket].copy_(pinned(padded, indices.device), non_blocking=True)
        self._rows_written, self._version_written = padded, _version(indices)

    def run(
        self, key: StepKey, width: int | None = None, token_masks: TokenMasks | None = None
    ) -> torch.Tensor:
        """Run the step for the rows in ``batch_indices[:key.bucket]``: the captured graph of the key when
        there is one (full-width block tables), else eagerly over the first ``width`` table columns.
        ``token_masks``: the grammar's masks of a drafting key with ``features.grammar`` (a zero-draft one reads
        ``grammar_masks``). Returns the step's packed outputs (``unpack``)."""
        graph = self.graphs.get(key)
        if graph is None:
            return self.step(key, width, token_masks)
        return graph.replay(token_masks) if isinstance(graph, MaskedStepCall) else graph.replay()

    def step(
        self, key: StepKey, width: int | None = None, token_masks: TokenMasks | None = None
    ) -> torch.Tensor:
        """The iteration (captured whole, or for a drafting key with a grammar in two parts: ``MaskedStepCall``).
        Returns [b * (depth + 1) + b (+ b * num_nodes for trees) (+ b * (depth + 1) * (2 + 2k) with
        log-probabilities)] int64: each row's output tokens (accepted drafts, the bonus, then -1), its number of
        accepted drafts, for trees each node's depth, and each output position's packed log-probabilities
        (``TokenLogprobs.pack``)."""
        with torch.inference_mode():
            return self.verify_and_commit(key, self.draft_and_forward(key, width), token_masks)

    def draft_and_forward(self, key: StepKey, width: int | None = None) -> Forwarded:
        """The step's first part: its rows, their drafts and the target's forward over them."""
        s, shape, b = self.req_table, key.shape, key.bucket
        with torch.inference_mode():
            req_indices = self.batch_indices[:b]  # [b]
            tables, lengths, last_tokens, seeds = s.rows(req_indices)  # tables: [b, max_blocks]
            rows = DecodeRows(
                req_indices,
                lengths,
                last_tokens,
                tables if width is None else tables[:, :width].contiguous(),
                seeds,
                s.sampling(req_indices, key.mode.greedy, key.mode.filtered, key.mode.seeded),
                s.pool.block_size,
                key.narrow,
            )
            drafts = (
                self.proposer.draft(rows, shape)
                if self.proposer is not None and not key.hold
                else chain_drafts(rows, [], [])
            )
            n = shape.num_nodes
            mask = (
                None if shape.is_chain else ancestor_mask(drafts.parents, shape.num_steps)
            )  # [b, n, n]
            with rows.context(rows.lengths, n, self.backend, mask) as ctx:
                recurrent = ctx.recurrent = (
                    self.states.decode(req_indices, rows.lengths)
                    if n == 1
                    else self.states.verify(
                        req_indices,
                        rows.lengths,
                        None if shape.is_chain else drafts.parents,
                        n if shape.is_chain else None,
                    )
                )
                # [b * n]: node 0 sits at L (plain decoding's positions are the lengths, no launch); a
                # chain's node i at L + i, its KV row, which the metadata's launch wrote; a tree's by depth
                if n == 1:
                    positions = rows.lengths
                elif shape.is_chain:
                    positions = ctx.metadata.token_positions
                else:
                    positions = (rows.lengths[:, None] + drafts.depths).reshape(-1)
                out = self.model(drafts.token_ids.reshape(-1), positions)
            return Forwarded(rows, drafts, mask, out, recurrent)

    def verify_and_commit(
        self, key: StepKey, forwarded: Forwarded, token_masks: TokenMasks | None = None
    ) -> torch.Tensor:
        """The step's second part: the verify of ``forwarded``'s drafts, then every commit (``step``'s
        outputs)."""
        s, shape = self.req_table, key.shape
        rows, drafts, out = forwarded.rows, forwarded.drafts, forwarded.out
        req_indices = rows.req_indices
        with torch.inference_mode():
            raw, result = self._verify(
                key, rows, drafts, out.hidden_states, forwarded.tree_mask, token_masks
            )
            if not shape.is_chain:
                self._commit_tree_kv(rows, result.accepted_path)
            if (
                key.features.penalties
            ):  # node 0 and the accepted drafts are output before the new last token
                path = result.accepted_path  # [b, depth + 1]
                count_tokens(
                    s.output_counts,
                    req_indices,
                    drafts.token_ids.gather(1, path.clamp(min=0)),
                    path >= 0,
                )
            if (
                shape.num_nodes > 1
            ):  # (a one-token step advanced the states in place; a no-op without recurrent state)
                self.states.commit(
                    req_indices, result.last_correct_step_indices, forwarded.recurrent
                )
            if self.proposer is not None:
                verified = Verified(rows, out.hidden_states, out.aux_hidden_states, result)
                if key.hold:
                    self.proposer.hold(verified)
                else:
                    self.proposer.update(verified)
            packed = [
                s.commit(
                    req_indices,
                    rows.lengths,
                    result.output_token_ids,
                    result.num_correct_drafts,
                    result.bonus_token_ids,
                )
            ]  # [b * (depth + 1) + b]
            if not shape.is_chain:
                packed.append(drafts.depths.reshape(-1))
            if key.features.logprobs is not None:
                packed.append(_committed_logprobs(raw, result, key.features.logprobs).pack())
            return torch.cat(packed) if len(packed) > 1 else packed[0]

    def _verify(
        self,
        key: StepKey,
        rows: DecodeRows,
        drafts: Drafts,
        hidden: torch.Tensor,
        tree_mask: torch.Tensor | None,
        token_masks: TokenMasks | None,
    ) -> tuple[torch.Tensor | None, VerifyResult]:
        """The target's verdict on the drafts from its last hidden states ``hidden`` [b * n, hidden]: (its raw
        logits [b, n, vocab], or None where a greedy step without logits features takes the argmax from the
        head without them (the model's ``greedy_tokens``: one launch for few rows on the GPU), the result)."""
        shape, b, n = key.shape, key.bucket, key.shape.num_nodes
        greedy_tokens = getattr(self.model, "greedy_tokens", None)
        if key.mode.greedy and not key.features.any and greedy_tokens is not None:
            predict = greedy_tokens(hidden).view(b, n)  # [b, n] the target's argmax at every node
            if shape.is_chain:
                return None, accept_greedy_chain(drafts.token_ids[:, 1:], predict)
            return None, accept_greedy_tree(
                drafts.parents, drafts.token_ids, predict, shape.num_steps
            )
        raw = self.model.compute_logits(hidden).view(b, n, -1)  # [b, n, vocab]
        logits = self._processed(key, rows, raw, drafts, tree_mask, token_masks)  # [b, n, vocab]
        keys = None if key.mode.greedy else rows.keys(0, VERIFY)  # greedy draws nothing
        gumbel = _node_gumbel(rows, drafts.depths, shape, logits.shape[-1])  # [b, n, vocab] or None
        if shape.is_chain:
            return raw, verify_chain(
                drafts.token_ids[:, 1:], drafts.draft_probs, logits, rows.sampling, keys, gumbel
            )
        return raw, verify_tree(
            drafts.parents,
            drafts.token_ids,
            None,
            logits,
            rows.sampling,
            keys,
            gumbel,
            max_depth=shape.num_steps,
        )

    def _processed(
        self,
        key: StepKey,
        rows: DecodeRows,
        logits: torch.Tensor,
        drafts: Drafts,
        tree_mask: torch.Tensor | None,
        token_masks: TokenMasks | None,
    ) -> torch.Tensor:
        """The logits verified: biased and penalized at every node as if its path were committed, then
        masked by the grammar. ``logits`` [b, n, V] -> [b, n, V]."""
        if key.features.penalties:
            ancestors = (
                tree_mask
                if tree_mask is not None
                else ancestor_mask(drafts.parents, key.shape.num_steps)
            )
            # [b, n]: the positions of the tokens the nodes decide
            positions = rows.lengths[:, None] + 1 + drafts.depths
            logits = self.req_table.penalties(self.batch_indices[: key.bucket]).apply(
                logits, positions, drafts.token_ids, ancestors
            )
        if key.features.grammar:
            n = key.shape.num_nodes
            masks = (
                self.grammar_masks[: key.bucket, :n] if token_masks is None else token_masks(drafts)
            )  # [b, n, words]
            logits = apply_token_bitmask(logits, masks)
        return logits

    def state_buffers(self, key: StepKey, recurrent: bool = True) -> list[torch.Tensor]:
        """Every per-request buffer a step of this key advances (each indexed by request row first); without a
        hybrid target's recurrent state where not ``recurrent`` (what a step run ahead saves: engine/run_ahead.py)."""
        table = self.req_table
        counts = [table.output_counts] if key.features.penalties else []
        drafter = self.proposer.state() if self.proposer is not None else []
        states = self.states.tensors() if recurrent else []
        return [table.lengths, table.last_tokens] + states + counts + drafter

    @staticmethod
    def unpack(host: list[int], key: StepKey, n: int) -> StepRows:
        """The first ``n`` rows of a step's packed outputs."""
        shape, b = key.shape, key.bucket
        width, nodes = shape.num_steps + 1, shape.num_nodes
        accepted = host[b * width : b * width + n]
        starts = range(0, n * width, width)  # each row's first output position
        tokens = [host[a : a + c + 1] for a, c in zip(starts, accepted)]
        at = b * width + b
        depths = None
        if not shape.is_chain:
            depths = [host[at + i * nodes + 1 : at + (i + 1) * nodes] for i in range(n)]
            at += b * nodes
        k = key.features.logprobs
        logprobs = None
        if k is not None:
            entries = TokenLogprobs.unpack_rows(host[at : at + n * width * (2 + 2 * k)], k)
            logprobs = [entries[a : a + c + 1] for a, c in zip(starts, accepted)]
        return StepRows(tokens, accepted, depths, logprobs)

    def _commit_tree_kv(self, rows: DecodeRows, path: torch.Tensor) -> None:
        """Move the target KV of each row's accepted nodes (``path`` [b, depth + 1], -1 after) from KV row
        L + node to row L + i, i their order on the path; a chain's path needs no move."""
        b, width = path.shape
        order = torch.arange(width, device=path.device).expand(b, -1)  # [b, depth + 1]
        src_rows = rows.lengths[:, None] + torch.where(path >= 0, path, order)  # unaccepted: stay
        dst_rows = rows.lengths[:, None] + order
        self.kv_rows.move(rows.cache_slots(src_rows), rows.cache_slots(dst_rows))


class MaskedStepCall:
    """A drafting step with a grammar as two captured calls (``DecodeStep.capture``): the draft and the target's
    forward; then, once the host has read the drafts back and written their masks into ``grammar_masks``, the
    verify and the commits. The host's part sits between two graph replays rather than inside an eager step. On
    the CPU each replay runs its part eagerly, the second over the first's latest outputs."""

    def __init__(self, step: DecodeStep, key: StepKey, memory_pool=None) -> None:
        device, self.step, self.key = step.req_table.device, step, key
        self.front = CapturedCall(lambda: step.draft_and_forward(key), device, memory_pool)
        # CUDA: the first part's static outputs, given values before the second part's warm-up reads them
        self.forwarded: Forwarded | None = self.front.replay() if device.type == "cuda" else None
        self.back = CapturedCall(
            lambda: step.verify_and_commit(key, self.forwarded), device, memory_pool
        )
        self.replays = 0

    def replay(self, token_masks: TokenMasks) -> torch.Tensor:
        self.replays += 1
        self.forwarded = self.front.replay()
        token_masks(self.forwarded.drafts)  # (into the grammar_masks the second part reads)
        return self.back.replay()

    def release(self) -> None:
        self.front.release()
        self.back.release()


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place write to it or a view of it); None for an inference
    tensor, which keeps none."""
    return None if t.is_inference() else t._version


def _node_gumbel(
    rows: DecodeRows, depths: torch.Tensor, shape: DraftShape, vocab: int
) -> torch.Tensor | None:
    """[b, n, vocab] the seeded rows' noise at each node (``depths`` [b, n]): that of the position the node
    decides, L + 1 + its depth, which the nodes of one depth share; None when no row is seeded."""
    gumbel = position_gumbel(rows, 1, shape.num_steps + 1, vocab)  # [b * (depth + 1), vocab]
    if gumbel is None:
        return None
    gumbel = gumbel.view(rows.size, shape.num_steps + 1, vocab)  # [b, depth + 1, vocab]
    return gumbel if shape.is_chain else gumbel.gather(1, depths[..., None].expand(-1, -1, vocab))


def _committed_logprobs(logits: torch.Tensor, result, k: int) -> TokenLogprobs:
    """Raw log-probabilities of each row's output positions (``result.output_token_ids`` [b, w], read
    at the accepted nodes ``result.accepted_path``; past the bonus: node 0 and token 0, ignored).
    ``logits`` [b, n, V] -> b * w rows."""
    b, _, vocab = logits.shape
    nodes = result.accepted_path.clamp(min=0)  # [b, w]
    rows = logits.gather(1, nodes[..., None].expand(-1, -1, vocab))  # [b, w, V]
    return token_logprobs(
        rows.reshape(-1, vocab), result.output_token_ids.clamp(min=0).reshape(-1), k
    )
