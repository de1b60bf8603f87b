"""MTP proposer: the target checkpoint's own multi-token-prediction layers draft.

Row convention: MTP layer k at row t reads the embedding of token t + k + 1 and a hidden state for
row t, and predicts token t + k + 2 (rotary position t). The hidden state is, chained
(Step-3.5-Flash; always for DeepSeek-V3-style layers), layer k - 1's pre-norm output at row t (layer
0: the target's last hidden state, pre-norm, or post-norm for DeepSeek-V3-style layers); not
chained, the target's at every layer. The layers choose their embedding, head and the form of the
target's state they read (models/mtp.py). Each layer's KV row t is final once token
t + k + 1 is committed.

Each propose runs every layer once, in chain order, over rows [L_prev - S + 1, L - 1] (L_prev: the
committed length at the previous propose, L now, S the number of layers used): the rows whose
tokens became committed since then (the draft-extend over exactly the accepted tokens, layer by
layer, that seed 001 fixes), plus, for layer k, the k rows whose token t + k + 1 is still a draft.
Layer k's last row predicts draft k + 1. Rows recomputed with committed inputs rewrite identical KV.

With a single MTP layer and more steps, that layer is reused autoregressively (DeepSeek-V3 style):
step j >= 2 is one row at position L + j - 2 reading draft j - 1 and the previous step's output.
"""
from __future__ import annotations

import torch

from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import ConfigError, SpeculativeConfig
from outpace.request import Request
from outpace.speculative.chain import ChainDrafts
from outpace.speculative.proposer import CommittedRows, DraftBatch, Proposer
from outpace.speculative.rows import draft_rows, row_positions


class MTPProposer(Proposer):
    def __init__(self, spec: SpeculativeConfig, target, pool: BlockPool, dtype: torch.dtype, device: str,
                 attention_backend: str = "torch") -> None:
        cfg = target.config
        n = cfg.num_nextn_predict_layers
        if n == 0:
            raise ConfigError(f"--method mtp needs a target with MTP layers: {cfg.architecture} checkpoint has "
                              f"num_nextn_predict_layers = 0")
        if spec.topk != 1:
            raise ConfigError(f"SpeculativeConfig.topk={spec.topk} is invalid for mtp: must be 1 (a chain)")
        if n > 1 and spec.num_steps > n:
            raise ConfigError(f"SpeculativeConfig.num_steps={spec.num_steps} is invalid for mtp: the target has "
                              f"{n} MTP layers, so at most {n} steps (more steps reuse a layer only when there is "
                              f"exactly one)")
        super().__init__(spec, pool, device, attention_backend)
        self.target = target
        self.layers = list(target.mtp_layers)[: min(n, spec.num_steps)]
        self.chained = cfg.chain_mtp_hidden_states or self.layers[0].chained_by_layout
        bind_kv_cache(target.mtp_layers, pool, dtype, device)
        # request id -> (first row still to run, the target's hidden states from that row on)
        self._hidden: dict[str, tuple[int, torch.Tensor]] = {}

    @property
    def lookahead(self) -> int:
        return self.spec.num_steps

    def release(self, request_id: str) -> None:
        self._hidden.pop(request_id, None)

    def observe(self, committed: CommittedRows) -> None:
        with torch.inference_mode():  # [total, hidden] in the form the MTP layers read
            hidden = self.layers[0].target_state(self.target, committed.hidden_states[committed.rows])
        offset = 0
        for req, start, count in zip(committed.requests, committed.starts, committed.counts):
            new = hidden[offset:offset + count]
            offset += count
            if req.request_id in self._hidden:
                first, old = self._hidden[req.request_id]
                self._hidden[req.request_id] = (first, torch.cat([old, new]))
            else:
                self._hidden[req.request_id] = (start, new)

    def _forward(self, layer, requests, starts, counts, token_ids, hidden) -> torch.Tensor:
        with draft_rows(self.pool, self.backend, requests, starts, counts, self.device):
            return layer(row_positions(starts, counts, self.device), layer.embed(self.target, token_ids), hidden)

    def propose(self, requests: list[Request]) -> DraftBatch:
        drafts = ChainDrafts(requests, self.device)
        with torch.inference_mode():
            starts, target_hidden, counts = [], [], []
            for r in requests:
                first, h = self._hidden[r.request_id]
                starts.append(first)
                counts.append(h.shape[0])
                target_hidden.append(h)
            target_hidden = torch.cat(target_hidden)
            keep = len(self.layers) - 1  # rows before the next new ones that every layer re-runs
            for r, first, h in zip(requests, starts, target_hidden.split(counts)):
                self._hidden[r.request_id] = (first + h.shape[0] - min(keep, h.shape[0]), h[h.shape[0] - min(keep, h.shape[0]):])
            last_rows = (torch.tensor(counts).cumsum(0) - 1).to(self.device)
            hidden = target_hidden
            for k, layer in enumerate(self.layers):
                # token t + k + 1 for rows t = first .. L - 1: committed tokens, then drafts 1..k
                tokens = []
                for i, r in enumerate(requests):
                    committed = r.token_ids[starts[i] + k + 1:]
                    tokens.append(torch.tensor(committed, dtype=torch.int64, device=self.device))
                    num_drafted = counts[i] - len(committed)  # the last rows read drafts k - num_drafted + 1 .. k
                    tokens += [d[i:i + 1] for d in drafts.tokens[k - num_drafted:k]]
                out = self._forward(layer, requests, starts, counts, torch.cat(tokens),
                                    hidden if self.chained else target_hidden)
                token = drafts.choose(layer.compute_logits(self.target, out[last_rows]))
                hidden = out
            if len(drafts.tokens) < self.spec.num_steps:  # one layer, reused
                layer, h = self.layers[0], hidden[last_rows]
                base = [r.num_computed_tokens for r in requests]
                for j in range(2, self.spec.num_steps + 1):
                    rows = [p + j - 2 for p in base]
                    h = self._forward(layer, requests, rows, [1] * len(requests), token, h)
                    token = drafts.choose(layer.compute_logits(self.target, h))
        return drafts.batch()
