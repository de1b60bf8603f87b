"""Speculative-decoding metrics: per request, and summed over requests."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecMetrics:
    """``num_verifies`` target verify steps proposed ``num_draft_tokens`` drafts in all, of
    which ``num_accepted_drafts`` were accepted; each verify also commits one bonus token.

    acceptance length tau = committed tokens / verifies = (accepted drafts + verifies) / verifies.
    ``accepted_per_position[i]``: verifies whose draft i (0-based depth) was accepted.
    ``histogram[n]``: verifies that accepted exactly n drafts.
    """

    num_verifies: int = 0
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, max_depth: int, num_accepted: int) -> None:
        """One verify of ``num_drafts`` drafts on paths of at most ``max_depth`` (a chain: both K)."""
        self.num_verifies += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_drafts += num_accepted
        _grow(self.accepted_per_position, max_depth)
        _grow(self.histogram, max_depth + 1)
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        self.histogram[num_accepted] += 1

    def merge(self, other: SpecMetrics) -> SpecMetrics:
        out = SpecMetrics(self.num_verifies + other.num_verifies, self.num_draft_tokens + other.num_draft_tokens,
                          self.num_accepted_drafts + other.num_accepted_drafts)
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        out.accepted_per_position = [_at(self.accepted_per_position, i) + _at(other.accepted_per_position, i)
                                     for i in range(n)]
        m = max(len(self.histogram), len(other.histogram))
        out.histogram = [_at(self.histogram, i) + _at(other.histogram, i) for i in range(m)]
        return out

    @property
    def acceptance_length(self) -> float:
        """tau: committed tokens per verify, the bonus token included."""
        return (self.num_accepted_drafts + self.num_verifies) / self.num_verifies if self.num_verifies else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / self.num_verifies for a in self.accepted_per_position] if self.num_verifies else []

    def to_dict(self) -> dict:
        return {"num_verifies": self.num_verifies, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_drafts": self.num_accepted_drafts, "acceptance_length": self.acceptance_length,
                "acceptance_rate_per_position": self.acceptance_rate_per_position, "histogram": self.histogram}


def _grow(values: list[int], size: int) -> None:
    values.extend([0] * (size - len(values)))


def _at(values: list[int], i: int) -> int:
    return values[i] if i < len(values) else 0
