"""N-gram prompt lookup, matched on the device: propose what followed the most recent earlier
occurrence of the longest suffix (between ``min_n`` and ``max_n`` tokens) of the prompt and output
so far.

Each row keeps its request's token history in a device row (``history`` [table_rows, max_len]): the
prompt at absorb, then every committed token at update. With L the request's length, tokens 0 .. L
are known (the last one at L). For each suffix length n, every window of n tokens ending before
position L is compared with the suffix at once (static shapes: all ``max_len`` windows, masked past
the history), the latest match of the longest n wins, and the ``num_steps`` tokens after it are the
drafts; a request without a match (or a continuation cut short by the history's end) is padded
with its last token: the verify just rejects what is wrong. Drafts are deterministic, so their
draft distribution is one-hot and speculative sampling stays exactly lossless.
"""

from __future__ import annotations

import torch

from outpace.config import SpeculativeConfig
from outpace.host_copies import to_device
from outpace.host_repeat import repeat_counts, run_positions
from outpace.speculative.chain import chain_drafts
from outpace.speculative.proposer import (
    DecodeRows,
    Drafts,
    DraftShape,
    PrefillRows,
    Proposer,
    Verified,
)
from outpace.validation import ConfigError


class NgramProposer(Proposer):
    takes_draft_checkpoint = False  # it drafts from the request's own tokens

    def __init__(
        self,
        spec: SpeculativeConfig,
        target,
        pool,
        max_requests: int,
        dtype,
        device: str,
        attention_backend: str = "torch",
    ) -> None:
        if spec.topk != 1:
            raise ConfigError(
                f"SpeculativeConfig.topk={spec.topk} is invalid for ngram: must be 1 (a chain)"
            )
        super().__init__(spec, pool, max_requests, device, attention_backend)
        self.min_n, self.max_n = spec.ngram_min, spec.ngram_max
        max_len = (
            target.config.max_position_embeddings + spec.num_steps + 1
        )  # writes past the end land here
        self.history = torch.zeros(max_requests + 1, max_len, dtype=torch.int64, device=self.device)

    @property
    def lookahead(self) -> int:
        return self.spec.num_steps

    def state(self) -> list[torch.Tensor]:
        return [self.history]

    def absorb(self, prefill: PrefillRows) -> None:
        counts = torch.tensor(prefill.counts)
        n = int(counts.sum())
        # the tokens the prefix cache gave a request before its first chunk, at positions 0 .. len - 1
        cached = [(r, t) for r, t in zip(prefill.req_indices, prefill.reused_token_ids) if t]
        lengths = torch.tensor([len(t) for _, t in cached], dtype=torch.int64)
        # [n + sum(lengths)] each: the prefill rows', then the cached tokens' history row and position, and the
        # cached tokens (0 under the prefill rows, whose tokens are on the device)
        rows = torch.cat(
            [
                repeat_counts(prefill.req_indices, counts),
                repeat_counts([r for r, _ in cached], lengths),
            ]
        )
        positions = torch.cat([run_positions(counts, prefill.starts), run_positions(lengths)])
        values = torch.tensor(
            [0] * n + [token for _, t in cached for token in t], dtype=torch.int64
        )
        indices, pos, tokens = to_device(
            torch.stack([rows, positions, values]), self.device
        )  # one copy
        self.history[indices[:n], pos[:n]] = prefill.token_ids
        # a completed prompt's sampled token, at its L
        self.history[indices[:n], pos[:n] + 1] = prefill.next_token_ids
        if cached:
            self.history[indices[n:], pos[n:]] = tokens[n:]

    def update(self, verified: Verified) -> None:
        rows, width = verified.rows, self.spec.num_steps + 1
        if self.history.is_cuda:  # one launch (drafters/ngram_kernel.py)
            from outpace.speculative.drafters.ngram_kernel import write_history

            result = verified.result
            write_history(
                self.history,
                rows.req_indices,
                rows.lengths,
                result.output_token_ids,
                result.bonus_token_ids,
                width,
            )
            return
        pos = (
            rows.lengths[:, None] + 1 + torch.arange(width, device=self.device)
        )  # [b, width]: L + 1 ..
        # Past the accepted tokens the padding (the bonus again) lands after the history's end.
        self.history[rows.req_indices[:, None], pos] = verified.next_tokens(width)

    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        k = shape.num_steps
        if k == 0:
            return chain_drafts(rows, [], [])
        history = self.history.index_select(0, rows.req_indices)  # [b, max_len]
        b, max_len = history.shape
        index = torch.arange(max_len, device=self.device)  # [max_len]
        last = rows.lengths[:, None]  # [b, 1] L
        found = torch.full(
            (b,), -1, dtype=torch.int64, device=self.device
        )  # continuation start, -1: none
        for n in range(self.max_n, self.min_n - 1, -1):  # the longest suffix first
            suffix = history.gather(
                1, (last - n + 1 + torch.arange(n, device=self.device)).clamp(min=0)
            )  # [b, n]
            windows = history.unfold(1, n, 1)  # [b, max_len - n + 1, n]
            starts = index[: max_len - n + 1]
            # a window ending before L, with a full suffix before L to compare (L + 1 >= n + 1)
            ok = (windows == suffix[:, None, :]).all(-1) & (starts + n <= last) & (last >= n)
            latest = torch.where(ok, starts + n, -1).amax(dim=1)  # [b]
            found = torch.where(found < 0, latest, found)
        cont = found[:, None] + torch.arange(k, device=self.device)  # [b, k]
        usable = (found[:, None] >= 0) & (cont <= last)
        tokens = torch.where(
            usable, history.gather(1, cont.clamp(0, max_len - 1)), rows.last_tokens[:, None]
        )
        return chain_drafts(rows, list(tokens.unbind(1)), [])
