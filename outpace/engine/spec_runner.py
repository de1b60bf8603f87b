"""One speculative step: propose -> one target forward (prefill chunks and verify trees together)
-> verify -> commit KV -> tell the proposer which rows were committed.

Requests in prefill bring their chunk; requests in decode bring the draft tree whose node 0 is
their last token (at position L) and whose node i sits at position L + depth(i) and in KV row
L + i. After verify, the accepted path's KV is moved to rows L, L + 1, ... (a no-op for chains)
and the rows past it are simply left behind: the next forward overwrites them. All results come
back to the host in one transfer.

With CUDA graphs (``enable_graphs``): a decode-only batch verifies through the captured target
forward of its bucket, and greedy EAGLE3 chains and greedy DFlash blocks run the whole iteration as
one replay (speculative/chain_graph.py).
"""
from __future__ import annotations

import torch

from outpace.attention import build_paged_metadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.engine.runner import ModelRunner
from outpace.engine.scheduler import ScheduledRequest, StepResult, is_decoding
from outpace.layers.sampler import SamplingTensors, sample
from outpace.request import SAMPLE, VERIFY, request_keys
from outpace.speculative.proposer import CommittedRows, Proposer
from outpace.speculative.tree import ancestor_mask
from outpace.speculative.verify import verify_chain, verify_tree


class SpeculativeRunner:
    def __init__(self, runner: ModelRunner, proposer: Proposer, spec: SpeculativeConfig) -> None:
        self.runner = runner
        self.proposer = proposer
        self.spec = spec
        self.iteration = None  # the captured whole iteration (greedy chain drafters), see enable_graphs
        runner.model.set_aux_hidden_state_layers(proposer.aux_layer_ids)

    def enable_graphs(self, oracle_rates=None) -> None:
        """Capture the verify forward (and, for EAGLE3 chains and DFlash, the whole iteration) for the
        runner's buckets. ``oracle_rates``: benchmark-only oracle acceptance (see speculative/chain_graph.py)."""
        from outpace.speculative.dflash import DFlashProposer
        from outpace.speculative.dflash_graph import DFlashChainGraph
        from outpace.speculative.eagle3 import Eagle3Proposer
        from outpace.speculative.eagle3_graph import Eagle3ChainGraph

        self.runner.capture_target(self.spec.num_draft_tokens, tree=self.spec.topk > 1)
        if isinstance(self.proposer, Eagle3Proposer) and self.spec.topk == 1:
            self.iteration = Eagle3ChainGraph(self.runner, self.proposer, oracle_rates)
        elif isinstance(self.proposer, DFlashProposer):  # topk is always 1
            self.iteration = DFlashChainGraph(self.runner, self.proposer, oracle_rates)
        elif oracle_rates is not None:
            raise ValueError("oracle acceptance needs a captured chain iteration (method eagle3 with topk 1, "
                             "or dflash)")

    def release(self, request_id: str) -> None:
        self.proposer.release(request_id)
        if self.iteration is not None:
            self.iteration.release(request_id)

    def execute(self, batch: list[ScheduledRequest]) -> list[StepResult]:
        prefill = [s for s in batch if not is_decoding(s.request)]
        decode = [s for s in batch if is_decoding(s.request)]
        if self.iteration is not None:
            if not prefill and self.iteration.accepts(decode):
                return self.iteration.run(decode)
            self.iteration.export_state()
        dev = self.runner.device
        drafts = self.proposer.propose([s.request for s in decode]) if decode else None
        n = self.spec.num_draft_tokens

        # ---- inputs: prefill chunks first, then one draft tree per decoding request
        starts = [s.request.num_computed_tokens for s in prefill]
        chunk_ids = [t for s, a in zip(prefill, starts) for t in s.request.token_ids[a:a + s.num_new_tokens]]
        ids = [torch.tensor(chunk_ids, dtype=torch.int64, device=dev)]
        pos = [torch.tensor([p for s, a in zip(prefill, starts) for p in range(a, a + s.num_new_tokens)],
                            dtype=torch.int64, device=dev)]
        tree_masks = None  # [decode, n, n] ancestor masks, for trees
        if drafts is not None:
            base = torch.tensor([s.request.num_computed_tokens for s in decode], device=dev)
            ids.append(drafts.token_ids.reshape(-1))
            pos.append((base[:, None] + drafts.depths).reshape(-1))
            if not drafts.is_chain:
                tree_masks = ancestor_mask(drafts.parents, self.spec.num_steps)
        order = prefill + decode
        graph = None if prefill else self.runner.captured(len(decode), n, tree=not drafts.is_chain)
        if graph is not None:
            with torch.inference_mode():
                out, decode_logits = graph.run([s.request.request_id for s in decode],
                                               [s.request.num_computed_tokens for s in decode], ids[1], pos[1],
                                               tree_masks)
        else:
            masks = [None] * len(prefill) + (list(tree_masks.unbind(0)) if tree_masks is not None
                                             else [None] * len(decode))
            meta = build_paged_metadata([self.runner.pool.table(s.request.request_id) for s in order],
                                        [s.request.num_computed_tokens for s in order],
                                        [s.num_new_tokens for s in prefill] + [n] * len(decode),
                                        self.runner.pool.block_size, dev, masks)
            with torch.inference_mode(), forward_context(meta, self.runner.backend):
                out = self.runner.model(torch.cat(ids), torch.cat(pos))

        # ---- sample finished prefills, verify drafts
        with torch.inference_mode():
            num_prefill_rows = sum(s.num_new_tokens for s in prefill)
            completing = [i for i, s in enumerate(prefill) if s.completes_sequence]
            ends = torch.tensor([s.num_new_tokens for s in prefill], dtype=torch.int64).cumsum(0) - 1
            rows = [ends[completing]] if completing else []
            if decode:
                rows.append(torch.arange(num_prefill_rows, num_prefill_rows + n * len(decode)))
            if graph is not None:
                logits = decode_logits
            else:
                logits = (self.runner.model.compute_logits(out.hidden_states[torch.cat(rows).to(dev)])
                          if rows else None)
            packed = []
            if completing:
                reqs = [prefill[i].request for i in completing]
                st = SamplingTensors.from_params([r.params for r in reqs], dev)
                packed.append(sample(logits[:len(completing)], st, request_keys(reqs, [r.num_tokens for r in reqs], SAMPLE, dev)))
            if decode:
                reqs = [s.request for s in decode]
                st = SamplingTensors.from_params([r.params for r in reqs], dev)
                target_logits = logits[len(completing):].view(len(decode), n, -1)
                gens = request_keys(reqs, [r.num_computed_tokens for r in reqs], VERIFY, dev)
                if drafts.is_chain:
                    res = verify_chain(drafts.token_ids[:, 1:], drafts.draft_probs, target_logits, st, gens)
                else:
                    res = verify_tree(drafts.parents, drafts.token_ids, None, target_logits, st, gens,
                                      max_depth=self.spec.num_steps)
                packed += [res.num_correct_drafts, res.output_token_ids.reshape(-1), res.accepted_path.reshape(-1)]
                if not drafts.is_chain:  # the engine's metrics count a tree's drafts by depth
                    packed.append(drafts.depths.reshape(-1).to(torch.int64))
            host = torch.cat(packed).tolist() if packed else []  # the step's one host sync

        # ---- unpack
        sampled = dict(zip(completing, host[:len(completing)]))
        results: list[StepResult] = []
        committed_rows, next_tokens, starts, counts, reqs_out = [], [], [], [], []
        offset = 0
        for i, s in enumerate(prefill):
            req, start = s.request, s.request.num_computed_tokens
            nxt = req.token_ids[start + 1:start + s.num_new_tokens + 1]
            new = [sampled[i]] if i in sampled else []
            committed_rows += range(offset, offset + s.num_new_tokens)
            next_tokens += nxt + new
            starts.append(start)
            counts.append(s.num_new_tokens)
            reqs_out.append(req)
            results.append(StepResult(new, s.num_new_tokens))
            offset += s.num_new_tokens
        if decode:
            b = len(decode)
            h = host[len(completing):]
            num_correct, h = h[:b], h[b:]
            depths = None
            if not drafts.is_chain:
                h, depths = h[:-b * n], h[-b * n:]
            width = len(h) // (2 * b)
            outputs, paths = h[:b * width], h[b * width:]
            moves = []
            for j, s in enumerate(decode):
                req, k = s.request, num_correct[j]
                path = paths[j * width:j * width + k + 1]
                tokens = outputs[j * width:j * width + k + 1]
                base_row = num_prefill_rows + j * n
                committed_rows += [base_row + node for node in path]
                next_tokens += tokens
                starts.append(req.num_computed_tokens)
                counts.append(k + 1)
                reqs_out.append(req)
                moves += [(req.request_id, req.num_computed_tokens + node, req.num_computed_tokens + i)
                          for i, node in enumerate(path) if node != i]
                results.append(StepResult(tokens, k + 1, k, None if depths is None else depths[j * n + 1:(j + 1) * n]))
            if moves:
                self._move_kv(moves)
        self.proposer.observe(CommittedRows(
            reqs_out, starts, counts, torch.tensor(committed_rows, dtype=torch.int64, device=dev),
            torch.tensor(next_tokens, dtype=torch.int64, device=dev), out.hidden_states, out.aux_hidden_states))
        by_request = {id(s.request): r for s, r in zip(order, results)}
        return [by_request[id(s.request)] for s in batch]

    def _move_kv(self, moves: list[tuple[str, int, int]]) -> None:
        """Copy the target's KV of accepted tree nodes (row src) to their committed rows (row dst)."""
        bs = self.runner.pool.block_size

        def slot(rid: str, row: int) -> int:
            return self.runner.pool.table(rid)[row // bs] * bs + row % bs

        src = torch.tensor([slot(r, a) for r, a, _ in moves], device=self.runner.device)
        dst = torch.tensor([slot(r, b) for r, _, b in moves], device=self.runner.device)
        for k_cache, v_cache in self.runner.kv_caches:
            for cache in (k_cache, v_cache):
                flat = cache.view(-1, *cache.shape[2:])
                flat[dst] = flat[src]
