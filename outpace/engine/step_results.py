"""What one step did for its scheduled requests (vLLM's ``ModelRunnerOutput``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator


@dataclass
class StepResults:
    """What one step did for its scheduled requests, one list per field (vLLM's ``ModelRunnerOutput``): entry i
    is the batch's request i's, so a step builds no object per request."""

    new_token_ids: list[int]  # the tokens to append, in order, one request's after another's
    num_new_tokens: list[int]  # each request's share of them (0 for an unfinished prefill chunk)
    num_committed: list[int]  # rows whose KV became valid
    num_accepted_drafts: list[
        int | None
    ]  # verified drafts accepted (None: not a speculative decode)
    draft_depths: list[
        list[int] | None
    ]  # a verified tree's drafts' depths (1 = a root's child); None: a chain
    num_drafts: list[int]  # drafts verified (the step's draft shape: 0 for plain decoding)
    max_depth: list[int]  # their deepest path
    # each new token's entry (request.PositionLogprobs; None for a request without params.logprobs), or None when
    # no request of the step has any
    logprobs: list | None = None

    @classmethod
    def interleave(
        cls, from_second: list[bool], first: StepResults | None, second: StepResults | None
    ) -> StepResults:
        """One batch's results from its two parts': request i is ``second``'s next when ``from_second[i]``, else
        ``first``'s (a part is None when it has no request)."""
        if first is None or second is None:
            return first if second is None else second
        parts = (first._requests(), second._requests())
        rows = [next(parts[s]) for s in from_second]
        tokens, counts, committed, accepted, depths, drafts, max_depth, logprobs = zip(*rows)
        entries = [e for part in logprobs for e in part]
        return cls(
            [t for part in tokens for t in part],
            list(counts),
            list(committed),
            list(accepted),
            list(depths),
            list(drafts),
            list(max_depth),
            None if all(e is None for e in entries) else entries,
        )

    def _requests(self) -> Iterator[tuple]:
        """Each request's fields, in order (its tokens and their entries as lists)."""
        at = 0
        for i, n in enumerate(self.num_new_tokens):
            yield (
                self.new_token_ids[at : at + n],
                n,
                self.num_committed[i],
                self.num_accepted_drafts[i],
                self.draft_depths[i],
                self.num_drafts[i],
                self.max_depth[i],
                [None] * n if self.logprobs is None else self.logprobs[at : at + n],
            )
            at += n
