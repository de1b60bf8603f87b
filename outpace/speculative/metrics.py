"""Speculative-decoding metrics: per request, and summed over requests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from itertools import zip_longest


@dataclass
class SpecMetrics:
    """``num_verifies`` target verify steps proposed ``num_draft_tokens`` drafts in all, of
    which ``num_accepted_drafts`` were accepted; each verify also commits one bonus token.

    Only drafts that could have been committed count: a verify commits at most the tokens its
    request may still take (max_tokens, the context), so with a budget of b tokens only the drafts
    at depth < b count, as proposed and as accepted (``record``).

    acceptance length tau = committed tokens / verifies = (accepted drafts + verifies) / verifies.
    ``accepted_per_position[i]``: verifies whose draft i (0-based depth) was accepted.
    ``proposed_per_position[i]``: verifies whose draft i could have been committed.
    ``histogram[n]``: verifies that accepted exactly n drafts.
    ``verifies_by_num_drafts[n]``: verifies that drafted n tokens (the draft shape each step chose:
    adaptive speculation changes it from step to step; 0 is a plain decoding step).
    """

    num_verifies: int = 0
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)
    proposed_per_position: list[int] = field(default_factory=list)
    verifies_by_num_drafts: list[int] = field(default_factory=list)

    def record(
        self,
        num_drafts: int,
        max_depth: int,
        num_accepted: int,
        budget: int | None = None,
        draft_depths: list[int] | None = None,
    ) -> None:
        """One verify of ``num_drafts`` drafts on paths of at most ``max_depth`` (a chain: both K)
        that accepted ``num_accepted``. ``budget``: tokens the request could still commit; only
        drafts at depth < budget count (a tree's by ``draft_depths``, 1-based: node 0 is not a draft)."""
        _grow(self.verifies_by_num_drafts, num_drafts + 1)
        self.verifies_by_num_drafts[num_drafts] += 1
        if budget is not None and budget - 1 < max_depth:
            max_depth = budget - 1
            num_drafts = (
                max_depth
                if draft_depths is None
                else sum(1 for d in draft_depths if d <= max_depth)
            )
            num_accepted = min(num_accepted, max_depth)
        self.num_verifies += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_drafts += num_accepted
        _grow(self.accepted_per_position, max_depth)
        _grow(self.proposed_per_position, max_depth)
        _grow(self.histogram, max_depth + 1)
        for i in range(max_depth):
            self.proposed_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        self.histogram[num_accepted] += 1

    @staticmethod
    def record_undrafted(metrics: Iterable[SpecMetrics]) -> None:
        """``record(0, 0, 0)`` for each of ``metrics`` (a verify of no draft: node 0 alone, whatever the budget),
        in one call: a step that drafted nothing runs no call per request."""
        for m in metrics:
            m.num_verifies += 1
            if m.verifies_by_num_drafts:
                m.verifies_by_num_drafts[0] += 1
            else:
                m.verifies_by_num_drafts.append(1)
            if m.histogram:
                m.histogram[0] += 1
            else:
                m.histogram.append(1)

    def merge(self, other: SpecMetrics) -> SpecMetrics:
        """The field-wise sum (lists element-wise, the shorter one padded with zeros)."""
        return SpecMetrics(
            **{f.name: _add(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)}
        )

    @classmethod
    def total(cls, metrics: Iterable[SpecMetrics]) -> SpecMetrics:
        """The sum of many (e.g. every output's ``spec_metrics`` of a generate call)."""
        result = cls()
        for m in metrics:
            result = result.merge(m)
        return result

    @property
    def acceptance_length(self) -> float:
        """tau: committed tokens per verify, the bonus token included."""
        return (
            (self.num_accepted_drafts + self.num_verifies) / self.num_verifies
            if self.num_verifies
            else 0.0
        )

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Draft i's acceptance rate over the verifies that could have committed it."""
        return [
            a / p if p else 0.0
            for a, p in zip(self.accepted_per_position, self.proposed_per_position)
        ]

    def to_dict(self) -> dict:
        keys = (
            "num_verifies",
            "num_draft_tokens",
            "num_accepted_drafts",
            "acceptance_length",
            "acceptance_rate_per_position",
            "accepted_per_position",
            "proposed_per_position",
            "histogram",
            "verifies_by_num_drafts",
        )
        return {key: getattr(self, key) for key in keys}


def _grow(values: list[int], size: int) -> None:
    values.extend([0] * (size - len(values)))


def _add(a: int | list[int], b: int | list[int]) -> int | list[int]:
    return [x + y for x, y in zip_longest(a, b, fillvalue=0)] if isinstance(a, list) else a + b
