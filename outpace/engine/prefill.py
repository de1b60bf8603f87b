"""The prefill step: chunks of prompts (or of recomputed requests) through one target forward.

Host work: flat inputs and (eager) attention metadata built from lists, a hybrid's recurrent-state checkpoints
loaded before the forward and saved after it (engine/scheduler.py says which), one forward (the forward
captured for the chunks' count and token bucket when one holds them, engine/prefill_graphs.py), the
first token sampled for each request whose prompt the chunk completes, the decode state of the requests
that decode next written into the request table, and the drafter told what was committed
(``Proposer.absorb``; its layers replayed as captured where a prefill key holds the chunks and the drafter
allows).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from outpace.attention import build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.recurrent_states import RecurrentStates
from outpace.engine.prefill_graphs import PrefillGraphs, PrefillKey
from outpace.engine.request_table import RequestTable
from outpace.engine.scheduler import ScheduledRequest
from outpace.engine.step_key import LogitsFeatures
from outpace.engine.step_results import StepResults
from outpace.host_copies import to_device
from outpace.layers.logits_processing import apply_token_bitmask, token_logprobs
from outpace.layers.sampler import SamplingTensors, is_greedy, sample
from outpace.request import SAMPLE, Request, position_logprobs, request_keys
from outpace.speculative.proposer import PrefillRows, Proposer
from outpace.structured import GrammarTable


class PrefillStep:
    def __init__(
        self,
        model: nn.Module,
        pool: BlockPool,
        backend,
        req_table: RequestTable,
        states: RecurrentStates,
        graphs: PrefillGraphs,
        proposer: Proposer | None,
        grammars: GrammarTable | None,
    ) -> None:
        self.model, self.pool, self.backend = model, pool, backend
        self.req_table, self.states, self.graphs = req_table, states, graphs
        self.proposer, self.grammars = proposer, grammars
        self.device = req_table.device

    def run(self, batch: list[ScheduledRequest]) -> StepResults:
        """Forward the batch's chunks; a token is sampled for each chunk that completes its sequence."""
        reqs = [s.request for s in batch]
        req_indices = self.req_table.assign(reqs)
        starts = [r.num_computed_tokens for r in reqs]
        counts = [s.num_new_tokens for s in batch]
        tables = [self.pool.table(r.request_id) for r in reqs]
        ids = [t for r, a, c in zip(reqs, starts, counts) for t in r.token_ids[a : a + c]]
        final = [s.completes_sequence for s in batch]  # a token is sampled
        decodes = [s.decodes_next for s in batch]  # the request's decode state starts
        done = [i for i, f in enumerate(final) if f]
        with torch.inference_mode():
            input_ids = to_device(ids, self.device)  # [sum(counts)]
            loads = [(i, s.load_checkpoint) for i, s in zip(req_indices, batch)]
            self.states.load_checkpoints(*_present(loads))
            key, out = self._forward(reqs, req_indices, starts, counts, tables, input_ids)
            saves = [(i, s.save_checkpoint) for i, s in zip(req_indices, batch)]
            self.states.save_checkpoints(*_present(saves))
            if any(r.prompt_logprobs is not None for r in reqs):
                self._record_prompt_logprobs(reqs, starts, counts, out.hidden_states)
            sampled = torch.empty(0, dtype=torch.int64, device=self.device)  # [len(done)]
            first_logprobs = None
            if done:
                ends = list(itertools.accumulate(counts))
                last_rows = to_device([ends[i] - 1 for i in done], self.device)
                sampled, first_logprobs = self._sample_first(
                    [reqs[i] for i in done],
                    [req_indices[i] for i in done],
                    out.hidden_states[last_rows],
                )
            if any(decodes):
                self._start_decoding(
                    reqs, req_indices, starts, counts, decodes, dict(zip(done, sampled.unbind(0)))
                )
            if self.proposer is not None:
                after = _tokens_after(reqs, starts, counts, sampled, self.proposer.absorb_reach)
                self._absorb(
                    key,
                    PrefillRows(
                        req_indices,
                        starts,
                        counts,
                        decodes,
                        torch.arange(len(ids), device=self.device),
                        input_ids,
                        *after,
                        out.hidden_states,
                        out.aux_hidden_states,
                        tables,
                        [r.token_ids[: s.num_reused_tokens] for r, s in zip(reqs, batch)],
                        [r.num_tokens for r in reqs],
                    ),
                )
            tokens = sampled.tolist()  # the completed prompts', in batch order
        n = len(batch)
        return StepResults(
            new_token_ids=tokens,
            num_new_tokens=[int(f) for f in final],
            num_committed=counts,
            num_accepted_drafts=[None] * n,
            draft_depths=[None] * n,
            num_drafts=[0] * n,
            max_depth=[0] * n,
            logprobs=first_logprobs,
        )

    def _forward(
        self,
        reqs: list[Request],
        req_indices: list[int],
        starts: list[int],
        counts: list[int],
        tables: list[list[int]],
        input_ids: torch.Tensor,
    ):
        """(the prefill key replayed or None, the target's forward over the chunks (``input_ids``
        [sum(counts)])): chunks that a prefill key holds replay its captured forward, others run eagerly."""
        key = self.graphs.bucket(counts, starts)
        if key is not None:
            self.req_table.sync_tables([r.request_id for r in reqs])
            return key, self.graphs.run(key, req_indices, starts, counts, input_ids)
        meta = build_paged_metadata(tables, starts, counts, self.pool.block_size, self.device)
        pos = torch.tensor(
            [p for a, c in zip(starts, counts) for p in range(a, a + c)], device=self.device
        )
        with forward_context(
            meta, self.backend, recurrent=self.states.prefill(req_indices, starts)
        ):
            return None, self.model(input_ids, pos)

    def _absorb(self, key: PrefillKey | None, rows: PrefillRows) -> None:
        """The drafter told what the chunks committed: its layers replayed as captured where the forward replayed
        ``key`` (``PrefillGraphs.absorbs_after``), else its eager absorb."""
        if not self.graphs.absorbs_after(key, rows):
            self.proposer.absorb(rows)
            return
        self.graphs.absorb(
            key,
            rows.req_indices,
            rows.starts,
            rows.counts,
            rows.token_ids,
            rows.next_token_ids,
            rows.ahead_token_ids,
            self.proposer.absorb_rows(rows),
        )
        self.proposer.absorb_state(rows)

    def _start_decoding(
        self,
        reqs: list[Request],
        req_indices: list[int],
        starts: list[int],
        counts: list[int],
        decodes: list[bool],
        sampled_at: dict[int, torch.Tensor],
    ) -> None:
        """The requests that decode next: their lengths and last tokens (just sampled, or for a recomputed
        request the one it has) written into the request table."""
        rows = [i for i, d in enumerate(decodes) if d]
        last = [
            sampled_at[i] if i in sampled_at else to_device([reqs[i].token_ids[-1]], self.device)[0]
            for i in rows
        ]
        self.req_table.start_decoding(
            [req_indices[i] for i in rows], [starts[i] + counts[i] for i in rows], torch.stack(last)
        )

    def _sample_first(
        self, reqs: list[Request], req_indices: list[int], hidden: torch.Tensor
    ) -> tuple[torch.Tensor, list | None]:
        """The token after each completed prompt, from its last row's hidden state [n, hidden]: ([n] tokens,
        each one's log-probabilities when some request wants them). Penalties, logit biases and grammars
        apply as in a decode step (the functions it uses, on one position), and the random key is that of
        the position sampled (num_tokens), as a decode node deciding it would draw: a seeded request gets the
        same token whether a recomputed prefill or a decode step samples it (layers/sampler.py)."""
        raw = self.model.compute_logits(hidden)  # [n, vocab]
        features = LogitsFeatures.of([r.params for r in reqs])
        logits = raw
        if (
            features.penalties
        ):  # the output so far is counted (all of it precedes the token sampled)
            for r in reqs:
                if r.params.penalized:
                    self.req_table.load_history(r, r.num_tokens)
            rows = to_device(req_indices, self.device)
            positions = to_device([[r.num_tokens] for r in reqs], self.device)  # [n, 1]
            logits = self.req_table.penalties(rows).apply(logits[:, None, :], positions)[:, 0]
        if features.grammar:
            words = self.grammars.mask_words
            masks = torch.empty(len(reqs), 1, words, dtype=torch.int32, device=self.device)
            self.grammars.next_token_masks(reqs, masks)  # [n, 1, words]
            logits = apply_token_bitmask(logits, masks[:, 0])
        if all(is_greedy(r.params) for r in reqs):
            tokens = logits.argmax(dim=-1)
        else:
            st = SamplingTensors.from_params([r.params for r in reqs], self.device)
            tokens = sample(
                logits, st, request_keys(reqs, [r.num_tokens for r in reqs], SAMPLE, self.device)
            )
        if features.logprobs is None:
            return tokens, None
        rows = token_logprobs(raw, tokens, features.logprobs).host_rows()
        return tokens, [
            position_logprobs(r.params.logprobs or 0, t, *row)
            for r, t, row in zip(reqs, tokens.tolist(), rows)
        ]

    def _record_prompt_logprobs(
        self, reqs: list[Request], starts: list[int], counts: list[int], hidden: torch.Tensor
    ) -> None:
        """Requests with ``prompt_logprobs``: the entry of every prompt token this chunk's rows predict (the
        row at position p predicts token p + 1), unless a run before preemption recorded it already."""
        offset = 0
        for r, a, c in zip(reqs, starts, counts):
            if r.prompt_logprobs is not None:
                first = max(a, len(r.prompt_logprobs) - 1)  # the first row whose entry is missing
                last = min(
                    a + c, r.num_prompt_tokens - 1
                )  # rows up to the one predicting the last prompt token
                if first < last:
                    rows = hidden[offset + first - a : offset + last - a]
                    targets = torch.tensor(
                        r.prompt_token_ids[first + 1 : last + 1], device=self.device
                    )
                    lp = token_logprobs(
                        self.model.compute_logits(rows), targets, r.params.prompt_logprobs
                    )
                    r.prompt_logprobs += [
                        position_logprobs(r.params.prompt_logprobs, t, *row)
                        for t, row in zip(targets.tolist(), lp.host_rows())
                    ]
            offset += c


def _tokens_after(
    reqs: list[Request], starts: list[int], counts: list[int], sampled: torch.Tensor, reach: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``PrefillRows.next_token_ids`` [sum(counts)], ``ahead_token_ids`` [len(reqs), reach]), one copy to the
    device: the token after each prefill row (the prompt's next one, or for the last row of a completed
    prompt the token just ``sampled``: [completed prompts] on the device, in batch order), then each
    chunk's ``reach`` tokens after its last row's next one, where the request holds them (0 past them)."""
    tokens, tails, ahead = [], [], []
    for r, a, c in zip(reqs, starts, counts):
        known = r.token_ids[a + 1 : a + c + 1]
        tokens += known + [0] * (
            c - len(known)
        )  # one row short exactly when the chunk completes the prompt
        if len(known) < c:
            tails.append(len(tokens) - 1)
        further = r.token_ids[a + c + 1 : a + c + 1 + reach]
        ahead += further + [0] * (reach - len(further))
    both = to_device(tokens + ahead + tails, sampled.device)
    next_ids, ahead_ids = both[: len(tokens)], both[len(tokens) : len(tokens) + len(ahead)]
    if tails:
        next_ids[both[len(tokens) + len(ahead) :]] = sampled
    return next_ids, ahead_ids.view(len(reqs), reach)


def _present(pairs: list[tuple[int, int | None]]) -> tuple[list[int], list[int]]:
    """The (request rows, checkpoint slots) of the pairs that name a slot."""
    kept = [(row, slot) for row, slot in pairs if slot is not None]
    return [row for row, _ in kept], [slot for _, slot in kept]
