"""Adaptive speculation: each step drafts as many tokens as pay off now.

For a batch of ``b`` requests, drafting k tokens a request commits on average
E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k tokens per verify, a_j the live probability that draft j
is accepted given that draft j - 1 was (estimated from every verify's outcome, with a decay so that
it follows the text), and costs the step time c(b, k) of its shape (every step is timed as it runs:
on the GPU between events around its graph replay; captured shapes start from a profile taken at
start-up on padding rows). The step takes the k of the highest
E(k) / c(b, k); k = 0 is plain decoding, so speculation is never chosen where it loses. Every
``probe_every``-th step drafts the most tokens, so that acceptance past the chosen k stays measured
(otherwise a drafter judged useless once would never be tried again). A shape whose cost for the
batch size is not known yet is tried once (the longest first). Against noise in the timings (a busy
CPU), a shape is never taken as cheaper than one with fewer drafts, and more drafts must promise a
``margin`` more tokens per second than fewer.
"""
from __future__ import annotations

from outpace.speculative.proposer import DraftShape


class DraftLengthChooser:
    def __init__(self, shapes: list[DraftShape], decay: float = 0.99, prior: float = 0.6, probe_every: int = 64,
                 cost_smoothing: float = 0.3, margin: float = 1.03) -> None:
        """``shapes``: the draft shapes to choose from (the longest last); per-position acceptance
        starts at ``prior`` (worth a few verifies) and forgets with ``decay`` per verify; a shape with
        more drafts must promise ``margin`` times the tokens per second of one with fewer."""
        self.shapes = sorted(shapes, key=lambda s: s.num_nodes)
        depth = max(s.num_steps for s in self.shapes)
        self.decay, self.probe_every, self.smoothing, self.margin = decay, probe_every, cost_smoothing, margin
        self.accepted = [prior * 4.0] * depth   # decayed counts, per draft position
        self.tried = [4.0] * depth
        self.costs: dict[tuple[int, DraftShape], float] = {}
        self._steps = 0

    def acceptance(self) -> list[float]:
        """a_j: the chance draft j is accepted when draft j - 1 was, per position."""
        return [a / t for a, t in zip(self.accepted, self.tried)]

    def expected_tokens(self, shape: DraftShape) -> float:
        """Tokens one verify of this shape commits on average: 1 + sum over depths of the chance to
        reach it (a tree counts by depth, as if its best path were a chain)."""
        total, reach = 1.0, 1.0
        for a in self.acceptance()[:shape.num_steps]:
            reach *= a
            total += reach
        return total

    def choose(self, bucket: int) -> DraftShape:
        self._steps += 1
        if self._steps % self.probe_every == 0:
            return self.shapes[-1]
        unknown = [s for s in self.shapes if (bucket, s) not in self.costs]
        if unknown:  # try it once: its cost is measured as it runs
            return unknown[-1]
        rate, cost = {}, 0.0
        for s in self.shapes:  # NOTE: more drafts never cost less: a cheaper timing is noise
            cost = max(cost, self.costs[bucket, s])
            rate[s] = self.expected_tokens(s) / cost
        best = max(rate.values())
        return next(s for s in self.shapes if rate[s] >= best / self.margin)  # the fewest drafts near the best

    def observe(self, shape: DraftShape, accepted_drafts: list[int]) -> None:
        """One verify per request: how many of its drafts were accepted."""
        k = shape.num_steps
        if k == 0:
            return
        for j in range(len(self.tried)):
            self.accepted[j] *= self.decay
            self.tried[j] *= self.decay
        for a in accepted_drafts:
            for j in range(min(a + 1, k)):  # positions tried: up to the first rejection
                self.tried[j] += 1
                self.accepted[j] += j < a

    def record_cost(self, bucket: int, shape: DraftShape, seconds: float) -> None:
        """A step's measured time (eager steps: smoothed; start-up profiles: as given, then fixed)."""
        key = (bucket, shape)
        old = self.costs.get(key)
        self.costs[key] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds
