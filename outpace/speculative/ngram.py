"""N-gram prompt lookup: propose what followed the most recent earlier occurrence of the longest
suffix (between ``min_n`` and ``max_n`` tokens) of the prompt and output so far.

Matching is vectorised with numpy sliding windows over each request's history (no Python loop
over tokens). Drafts are deterministic, so their draft distribution is one-hot and speculative
sampling stays exactly lossless. A request without a match (or a short continuation) is padded
with its last token: the verify just rejects what is wrong.
"""
from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from outpace.config import SpeculativeConfig
from outpace.request import Request
from outpace.speculative.chain import ChainDrafts
from outpace.speculative.proposer import CommittedRows, DraftBatch, Proposer


def lookup(history: np.ndarray, num_drafts: int, min_n: int, max_n: int) -> list[int]:
    """The continuation after the latest earlier match of the longest suffix n-gram (may be short)."""
    for n in range(min(max_n, len(history) - 1), min_n - 1, -1):
        windows = sliding_window_view(history[:-1], n)               # [len - n, n], starts 0 .. len - n - 1
        hits = np.flatnonzero((windows == history[-n:]).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return history[start:start + num_drafts].tolist()
    return []


class NgramProposer(Proposer):
    def __init__(self, spec: SpeculativeConfig, target, pool, dtype, device: str,
                 attention_backend: str = "torch") -> None:
        if spec.topk != 1:
            raise ValueError(f"SpeculativeConfig.topk={spec.topk} is invalid for ngram: must be 1 (a chain)")
        super().__init__(spec, pool, device, attention_backend)
        self.min_n, self.max_n = spec.ngram_min, spec.ngram_max

    @property
    def lookahead(self) -> int:
        return self.spec.num_steps

    def observe(self, committed: CommittedRows) -> None:
        pass  # the history is the request's own tokens

    def release(self, request_id: str) -> None:
        pass

    def propose(self, requests: list[Request]) -> DraftBatch:
        k = self.spec.num_steps
        rows = []
        for r in requests:
            found = lookup(np.asarray(r.token_ids), k, self.min_n, self.max_n)
            rows.append(found + [r.token_ids[-1]] * (k - len(found)))
        drafts = ChainDrafts(requests, self.device)
        for column in torch.tensor(rows, dtype=torch.int64, device=self.device).unbind(1):
            drafts.add(column)
        return drafts.batch()
