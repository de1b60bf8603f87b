"""Adaptive speculation: each step drafts the shape that pays off now.

For a batch of ``b`` requests, a shape of depth k commits on average
E = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k tokens per verify, a_j the live probability that the accepted path
reaches depth j given that it reached depth j - 1. Acceptance is kept per kind of shape: one set for every
chain length (a chain's depth j is its draft j, whatever its length), and one per tree shape (a tree's
accepted path reaches depth j more often than a chain's, and differently for each width). It is estimated
from every verify's outcome, with a decay so that it follows the text. A shape costs the step time c(b, s)
(every step is timed as it runs: on the GPU between events around its graph replay; captured shapes start
from a profile taken at start-up on padding rows). The step takes the shape of the highest E / c(b, s);
no drafts (plain decoding) is one of the shapes, so speculation is never chosen where it loses.

Acceptance differs between requests (a prompt that repeats itself, a sampled request that rarely agrees with
its drafts), so each request also keeps its own decayed counts, and its rate at depth j is those counts
blended with the batch-wide rate, which weighs ``REQUEST_PRIOR`` verifies: a new request follows the batch,
one with a history follows itself, unless the batch's requests differ no more than chance explains: then
they share their pooled rate (``_batch_rates``). A batch's E is the mean of its requests' E. This matters most
where few requests are left: the end of a closed batch is its slowest requests, which drafts help least (bench e2e
measured n-gram at temperature 0.8 losing there to plain decoding while gaining 1.2x in steady state).

A choice reads the batch-wide rates ``OPTIMISM`` binomial standard errors above the counts (an upper confidence
bound, the bandit's answer to exploration): a drafter judged on a few verifies is judged by what they cannot
rule out, and no drafts never becomes a choice that nothing would revisit. Plain steps observe nothing, so an
estimate that a few unlucky first verifies pulled under the break-even held a run at plain decoding: bench e2e's
widened DeepSeek MTP row at temperature 0.8 drafted in 1% of its verifies (tau 1.01, 0.98x plain decoding, where
other runs of it drafted in most and made 1.27x; benchmarks/results/gpu_2026-12-01j, call 5). Simulated
(benchmarks/scripts/chooser_lock_in.py, 60 runs of 8 requests of 64 tokens each at that row's step costs), runs
mostly plain at first-draft rates 0.66 / 0.5 fell from 6 / 48 to 0 / 6; where drafts never pay (0.3) the bound
cost 0.2% of the plain rate. With many verifies the bound is within a few hundredths of the rate.

What is best depends on what the batch is waiting for. With requests waiting (a server under load), the
step maximises throughput: the batch's mean E over c(b, s). With none waiting (a closed batch: ``LLM.generate``
on a list, or a server whose every request is running), the batch ends with its slowest request, so the step
minimises the time until the last request's end: c(b, s) times the most steps any request still needs. A
request that drafts rarely help (a prompt with no repetition for n-gram, a sampled request that disagrees with
its drafts) gains one token per step whatever the shape, so once it is the slowest, no drafts is the cheapest
shape for everyone (bench e2e measured adaptive n-gram at 0.89x of plain decoding in a closed batch of 8 under
the throughput rule alone). The steps a request needs are not its remaining budget over its E: a verify
commits a whole number of tokens, drawn anew each step, and the batch waits for the unluckiest request, not
for the average one. So each request's step count is a normal draw (n verifies commit tokens of mean n E and
variance n V, V the variance of the depth a verify reaches: its steps have mean t / E, kept between the steps
that accepting every draft would take and one a token, and variance t V / E^3 for t tokens), and the batch's
steps are the expected largest of the draws (``expected_largest``). That is for requests of one rate (pooled, or
all new); where their rates differ, the request of the lowest sets the batch's end, at its mean. Without the
draws' spread, at temperature 0.8 on the H200 (widened zoo, a closed batch of 32 requests of 128 tokens), n-gram
drafted 4 of the batch's last 10 steps, with 19 to 30 requests left, at up to 1.5x a plain step's cost, and ended
on the same step as plain decoding, its decode steps 2.4% longer (benchmarks/results/gpu_2026-12-01b, call 4).
The draws are each request's own: after drafting steps the requests' remaining tokens differ by their luck so
far, and the largest of the draws counts it once. Until 2026-12-06 each request's steps were instead taken at
the quantile of the unluckiest of b requests, and the largest of those counted the request already behind as
unlucky once more: a batch that had begun to draft then judged drafting on as losing and held, its drafting
steps' extra time spent for nothing. Qwen3.5's widened EAGLE3 did so at batch 32 and temperature 0.8 (64
tokens: 13 drafting steps, then held; 0.978x plain decoding's closed batch, benchmarks/results/gpu_2026-12-06,
call 34). Simulated at that row's rates and costs (benchmarks/scripts/closed_batch_spread.py, 300 runs), the
requests' first-draft rates one: 514.1 ms a closed batch with the quantile, 493.4 with the largest of the draws
(plain decoding 514.6, one draft a step throughout 480.8); spread by 0.1: 522.5 and 521.2; greedy, within the
runs' noise (spread by 0.1: 317.4 and 318.2, +- 1.8).

Every ``probe_every``-th step drafts a probe shape instead, in turn a chain one draft deeper than the chain last
chosen (none where that was the longest) and each tree, so that acceptance past the chosen shape stays measured
(otherwise a drafter judged useless once would never be tried again). One draft deeper is what the next choice
can use: a draft at depth j + 1 is reached only through depth j, so where depth j does not pay, nothing deeper
does, and a chain that comes to pay is deepened a depth a probe. A probe of the longest chain cost a closed batch
of n-gram requests at temperature 0.8 (their drafts rarely land) a step of four drafts, 1.6 ms over a plain
step's 4.2 at batch 8 on the H200 (benchmarks/results/gpu_2026-12-01f, call 2); one past the deepest chain chosen
since the last probe, a step of two drafts, 1.7 ms, where the batch had chosen one draft for four steps at its
start and plain decoding for the other 120 (gpu_2026-12-01j, call 1: 24 rows cross the few-row kernels' 16).

In a closed batch whose remaining steps are fewer than the probes' spacing (no later choice of the batch would use
the probe), a probe waits, but for one spacing at most: the chooser outlives the batch, and closed batches of
requests no longer than the spacing (bench e2e's 64 tokens at batch 1) would otherwise never be probed, so that a
drafter whose first verifies were unlucky stayed at plain decoding for every request after. bench e2e's widened
DeepSeek MTP row at temperature 0.8 fell from 1.27x to 1.06x between two runs (neither probed), 134 of its 360
verifies plain and its depth-2 rate 0.28 against 0.70 (gpu_2026-12-01j, call 4); simulated
(benchmarks/scripts/chooser_lock_in.py: acceptance 0.7 at both depths, that row's step costs), 6 runs in 30
decoded mostly plainly, 1 with this bound and the lone-request test of ``_batch_rates``.

With a ``probe_budget`` (the engine's: ``PROBE_BUDGET``), probes are further
apart where they cost more: a probe's extra time over the cheapest shape's, in steps of that shape, is at most
that fraction of the steps since the last probe. At batch 32 a probe costs 1.5 to 2.5 zero-draft steps (the
H200's profiled chain costs, Qwen3.5 with EAGLE3 and MTP): one in 64 steps spent 2.3% of the time of a batch
that drafted nothing else (bench e2e, 32 probes in 1992 steps; benchmarks/results/gpu_2026-11-30d, call 1).
A shape whose cost for the batch size is not known yet is tried once (the longest first).
Against noise in the timings (a busy CPU), a shape is never taken as cheaper than one with fewer nodes
(or, at as many nodes, fewer branches), and a larger shape must promise a ``margin`` more tokens per
second than a smaller one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import cache
from itertools import accumulate, repeat
from operator import mul

from outpace.speculative.proposer import DraftShape

CHAINS = "chain"  # the acceptance key every chain length shares
REQUEST_PRIOR = 4.0  # a request's own rates start as the batch-wide ones, worth this many verifies
OPTIMISM = 1.0  # the batch-wide rates a choice reads: this many standard errors above the counts' (``_batch_rates``)
PROBE_BUDGET = (
    0.01  # the engine's choosers: probes' extra time at most 1% of the steps' (module docstring)
)


def acceptance_key(shape: DraftShape) -> DraftShape | str:
    """Whose acceptance a shape's verifies measure: the chains' (shared) or the tree shape's own."""
    return CHAINS if shape.is_chain else shape


class _DepthAcceptance:
    """Decayed counts, per depth, of verifies whose accepted path tried and reached that depth."""

    def __init__(self, depth: int, prior: float, weight: float = 4.0) -> None:
        self.accepted = [prior * weight] * depth  # a prior worth ``weight`` verifies
        self.tried = [weight] * depth

    @classmethod
    def pooled(cls, parts: Sequence[_DepthAcceptance]) -> _DepthAcceptance:
        """The counts of ``parts`` (of one depth) added together."""
        total = cls(len(parts[0].tried), 0.0, weight=0.0)
        total.accepted = [sum(a) for a in zip(*(p.accepted for p in parts))]
        total.tried = [sum(t) for t in zip(*(p.tried for p in parts))]
        return total

    def rates(self) -> list[float]:
        return [a / t for a, t in zip(self.accepted, self.tried)]

    def optimistic(self, z: float) -> list[float]:
        """The rates ``z`` binomial standard errors above themselves (at most 1): ``DraftLengthChooser._batch_rates``."""
        return [
            min(1.0, p + z * math.sqrt(p * (1.0 - p) / t)) for p, t in zip(self.rates(), self.tried)
        ]

    def blended(self, prior: list[float], weight: float) -> list[float]:
        """The rates with ``prior`` [depth] counted as ``weight`` more verifies."""
        return [
            (a + weight * p) / (t + weight) for a, t, p in zip(self.accepted, self.tried, prior)
        ]

    def observe(self, depth: int, accepted_drafts: list[int], decay: float) -> None:
        self.accepted, self.tried = (
            [a * decay for a in self.accepted],
            [t * decay for t in self.tried],
        )
        for a in accepted_drafts:
            for j in range(min(a + 1, depth)):  # depths tried: up to the first rejection
                self.tried[j] += 1
                self.accepted[j] += j < a


class _ReachRows:
    """One batch's reaches for the shapes of one kind (``DraftLengthChooser._reach_rows``), from each request's
    rates per depth (batch-wide: one row). Where every request has the same rates (``alike``) one row stands for
    them all: the per-request lists below then hold that one row (a closed batch of 32 pooled requests asks for
    them at every step, for every shape)."""

    def __init__(self, rates: list[list[float]]) -> None:
        n = len(rates)
        # one rate for every request (pooled, or all new)
        self.alike = all(r == rates[0] for r in rates)
        distinct = rates[:1] if self.alike else rates
        # per request (alike: the one row), a_1, a_1 a_2, ... over the depths, and their running sums
        self.reaches = [list(accumulate(r, mul)) for r in distinct]
        self.sums = [list(accumulate(r)) for r in self.reaches]
        # and the running sums of (2j - 1) a_1 ... a_j: E[A^2] of the drafts A a verify accepts to depth j
        self.squares = [
            list(accumulate(map(mul, r, range(1, 2 * len(r), 2)))) for r in self.reaches
        ]
        # per depth j, the mean over the requests of a_1 ... a_j (alike: the same n terms added in the same order)
        if self.alike:
            self.mean = [sum(repeat(reach / n, n)) for reach in self.reaches[0]]
        else:
            self.mean = [sum(reach / n for reach in d) for d in zip(*self.reaches)]
        self._per_verify: dict[int, list[float]] = {}
        self._variances: dict[int, list[float]] = {}

    def tokens_per_verify(self, num_steps: int) -> list[float]:
        """Per request (alike: one for all), the tokens a verify of a chain of ``num_steps`` commits: 1 + its
        reaches' sum to that depth."""
        tokens = self._per_verify.get(num_steps)
        if tokens is None:
            depth = num_steps - 1
            tokens = self._per_verify[num_steps] = [
                1.0 + (row[min(depth, len(row) - 1)] if row else 0.0) for row in self.sums
            ]
        return tokens

    def variance_per_verify(self, num_steps: int) -> list[float]:
        """Per request (alike: one for all), the variance of the drafts A a verify of ``num_steps`` accepts: P(A >=
        j) is the reach a_1 ... a_j, so E[A] is the reaches' sum and E[A^2] the sum of (2j - 1) times each, to that
        depth."""
        variances = self._variances.get(num_steps)
        if variances is None:
            depth = num_steps - 1
            variances = self._variances[num_steps] = [
                sq[min(depth, len(sq) - 1)] - s[min(depth, len(s) - 1)] ** 2 if s else 0.0
                for s, sq in zip(self.sums, self.squares)
            ]
        return variances


class DraftLengthChooser:
    def __init__(
        self,
        shapes: list[DraftShape],
        decay: float = 0.99,
        prior: float = 0.6,
        probe_every: int = 64,
        cost_smoothing: float = 0.3,
        margin: float = 1.03,
        probe_budget: float | None = None,
    ) -> None:
        """``shapes``: the draft shapes to choose from; acceptance per depth starts at ``prior`` and forgets
        with ``decay`` per verify of its shapes; a larger shape must promise ``margin`` times the tokens per
        second of a smaller one; a probe comes every ``probe_every`` steps, or further apart within
        ``probe_budget`` (module docstring; None: no bound)."""
        self.probe_budget = probe_budget
        self._since_probe = 0  # steps chosen since the last probe
        self._probes_taken = 0
        self.shapes = sorted(shapes, key=lambda s: (s.num_nodes, s.topk))
        self.decay, self.probe_every, self.smoothing, self.margin = (
            decay,
            probe_every,
            cost_smoothing,
            margin,
        )
        self._depths: dict[DraftShape | str, int] = {}  # the deepest shape of each kind
        for s in self.shapes:
            if s.num_steps:
                self._depths[acceptance_key(s)] = max(
                    s.num_steps, self._depths.get(acceptance_key(s), 0)
                )
        self._acceptance = {
            key: _DepthAcceptance(depth, prior) for key, depth in self._depths.items()
        }
        self._chains = [s for s in self.shapes if s.is_chain]  # by depth, plain decoding first
        self._last_chain = 0  # the depth of the chain last chosen (not probed)
        # in turn: the chain probe (None: ``_next_probe`` picks the chain when its turn comes), then each tree
        self.probes: list[DraftShape | None] = [None] * (len(self._chains) > 1) + [
            s for s in self.shapes if not s.is_chain
        ]
        self._own: dict[
            str, dict[DraftShape | str, _DepthAcceptance]
        ] = {}  # request id -> its own counts
        self.costs: dict[tuple[int, DraftShape], float] = {}
        self._version = 0  # bumped whenever acceptance counts change (observe, forget)
        # per kind of shape: (version, request ids, _ReachRows) of the last batch asked about: a run of steps with
        # no drafts observes nothing, so its choices read what the first computed, with no work per request
        self._reach_cache: dict[DraftShape | str, tuple[int, tuple[str, ...], _ReachRows]] = {}

    def acceptance(
        self, shape: DraftShape | None = None, request_id: str | None = None
    ) -> list[float]:
        """a_j per depth for ``shape``'s kind (None: the chains'; empty when there are none): batch-wide, or
        for ``request_id`` its own counts blended with the batch-wide rates (module docstring)."""
        key = CHAINS if shape is None else acceptance_key(shape)
        stats = self._acceptance.get(key)
        return [] if stats is None else self._rates_of(key, request_id, stats.rates())

    def _rates_of(
        self, key: DraftShape | str, request_id: str | None, batch_wide: list[float]
    ) -> list[float]:
        """The request's rates for ``key``'s shapes: ``batch_wide`` blended with its own counts, if it has any."""
        own = self._own.get(request_id, {}).get(key)
        return batch_wide if own is None else own.blended(batch_wide, REQUEST_PRIOR)

    def _batch_rates(
        self, key: DraftShape | str, request_ids: tuple[str, ...]
    ) -> list[list[float]]:
        """Each request's rates for ``key``'s shapes in this batch (batch-wide: one row). Empirical Bayes, on
        depth 1: where the requests' own rates spread no wider than the binomial noise of their counts
        explains (within two standard errors of a sample variance), they share one rate, their counts
        pooled and blended with the batch-wide rates like one request's; otherwise each has its own
        (``_rates_of``). Without pooling, the slowest-looking of 32 requests, unlucky in two verifies, held a
        closed batch at plain decoding, where plain steps teach nothing that would let it go (bench e2e,
        Qwen3.5 MTP at batch 32 and acceptance 0.78: 1774 request verifies without drafts and 107 with two,
        which paid 1.18x; benchmarks/results/gpu_2026-11-30b, call 1). A lone request is tested the same way
        against the batch-wide rate (within two standard errors of its own rate): one unlucky in its first
        verifies (2 first drafts landing in 6 where the batch's land 7 in 10) keeps the batch-wide rates rather
        than its blend, which would decode plainly for the rest of its tokens."""
        stats = self._acceptance[key]
        p = stats.rates()[0]
        batch_wide = stats.optimistic(OPTIMISM)
        owns = [self._own.get(r, {}).get(key) for r in request_ids]
        counted = [o for o in owns if o is not None and o.tried[0] > 0]
        if len(counted) >= 2 and 0.0 < p < 1.0:
            rates = [o.accepted[0] / o.tried[0] for o in counted]
            mean = sum(rates) / len(rates)
            spread = sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)
            noise = sum(p * (1.0 - p) / o.tried[0] for o in counted) / len(counted)
            # (the sample variance of n rates strays from the noise by sqrt(2 / (n - 1)) of it: 2 of those)
            if spread <= noise * (1.0 + 2.0 * math.sqrt(2.0 / (len(rates) - 1))):
                shared = _DepthAcceptance.pooled(counted).blended(batch_wide, REQUEST_PRIOR)
                return [shared] * len(request_ids)
        if len(counted) == 1 == len(request_ids) and 0.0 < p < 1.0:
            own = counted[0]
            if (own.accepted[0] / own.tried[0] - p) ** 2 <= 4.0 * p * (1.0 - p) / own.tried[0]:
                return [batch_wide]
        return [self._rates_of(key, r, batch_wide) for r in request_ids] or [batch_wide]

    def expected_tokens(self, shape: DraftShape, request_ids: Sequence[str] = ()) -> float:
        """Tokens one verify of this shape commits on average, per request of the batch (``request_ids``;
        none: batch-wide): 1 + the chance to reach each depth."""
        return self._expected(shape, request_ids, {})

    def _expected(self, shape: DraftShape, request_ids: Sequence[str], reach: dict) -> float:
        """``expected_tokens``, with ``reach`` caching each kind's mean reach over the batch."""
        if not shape.num_steps:
            return 1.0
        key = acceptance_key(shape)
        if key not in reach:
            reach[key] = self._mean_reach(key, request_ids)
        return 1.0 + sum(reach[key][: shape.num_steps])

    def _mean_reach(self, key: DraftShape | str, request_ids: Sequence[str]) -> list[float]:
        """Per depth j of ``key``'s shapes, the mean over the requests of a_1 ... a_j (batch-wide: one row)."""
        return self._reach_rows(key, request_ids).mean

    def _reach_rows(self, key: DraftShape | str, request_ids: Sequence[str]) -> _ReachRows:
        """The batch's reaches for ``key``'s shapes, computed again only when the batch or the counts changed."""
        ids = tuple(request_ids)
        cached = self._reach_cache.get(key)
        if cached is None or cached[0] != self._version or cached[1] != ids:
            cached = (self._version, ids, _ReachRows(self._batch_rates(key, ids)))
            self._reach_cache[key] = cached
        return cached[2]

    def _steps_to_finish(
        self, shape: DraftShape, request_ids: Sequence[str], remaining: Sequence[int]
    ) -> float:
        """The steps of ``shape`` the batch still needs (module docstring): where its requests share one rate, the
        expected largest of their step counts; where their rates differ, the largest of their mean counts."""
        if not shape.num_steps:
            return float(max(remaining))
        rows = self._reach_rows(acceptance_key(shape), request_ids)
        means = rows.tokens_per_verify(shape.num_steps)
        width = shape.num_steps + 1
        if not rows.alike:
            return max(mean_steps(t, m, width) for t, m in zip(remaining, means))
        m, v = means[0], rows.variance_per_verify(shape.num_steps)[0]
        return expected_largest(
            [
                (mean_steps(t, m, width), math.sqrt(max(0.0, t * v) / m**3), count)
                for t, count in Counter(remaining).items()
            ]
        )

    def choose(
        self,
        bucket: int,
        request_ids: Sequence[str] = (),
        remaining: Sequence[int] | None = None,
    ) -> DraftShape:
        """The shape of the next step of a batch of ``bucket`` rows holding ``request_ids``. ``remaining``
        (in the same order): each request's remaining token budget when no request is waiting, so that the
        step minimises the time until the batch's last token; None (requests waiting): the step maximises
        throughput (module docstring)."""
        self._since_probe += 1
        due = self._next_probe()
        if due is not None:
            turn, probe = due
            interval = self._probe_interval(bucket, probe)
            waited = remaining is not None and max(remaining) <= interval  # (module docstring)
            if self._since_probe >= (2 * interval if waited else interval):
                self._since_probe, self._probes_taken = 0, turn + 1
                return probe
        unknown = [s for s in self.shapes if (bucket, s) not in self.costs]
        if unknown:  # try it once: its cost is measured as it runs
            return unknown[-1]
        chosen = self._best(bucket, request_ids, remaining)
        if chosen.is_chain:
            self._last_chain = chosen.num_steps
        return chosen

    def _next_probe(self) -> tuple[int, DraftShape] | None:
        """The probe whose turn it is, and that turn: a tree, or the chain one draft deeper than the chain last
        chosen (module docstring), whose turn passes to the next tree where that was the longest; None: nothing to
        probe."""
        for turn in range(self._probes_taken, self._probes_taken + len(self.probes)):
            probe = self.probes[turn % len(self.probes)]
            if probe is None:
                probe = next((s for s in self._chains if s.num_steps > self._last_chain), None)
            if probe is not None:
                return turn, probe
        return None

    def _best(
        self, bucket: int, request_ids: Sequence[str], remaining: Sequence[int] | None
    ) -> DraftShape:
        """The shape of the best rate for the batch (``choose``), every cost known."""
        rate, cost, reach = {}, 0.0, {}
        for s in self.shapes:  # NOTE: larger shapes never cost less: a cheaper timing is noise
            cost = max(cost, self.costs[bucket, s])
            if remaining is None:
                rate[s] = self._expected(s, request_ids, reach) / cost
            else:  # (the batch's finish rate: the inverse of its time to the last token)
                rate[s] = 1.0 / (cost * self._steps_to_finish(s, request_ids, remaining))
        best = max(rate.values())
        return next(
            s for s in self.shapes if rate[s] >= best / self.margin
        )  # the smallest near the best

    def _probe_interval(self, bucket: int, probe: DraftShape) -> float:
        """Steps from one probe to the next: ``probe_every``, or more where the probe's extra time over the
        cheapest shape's exceeds ``probe_budget`` of the steps in between (module docstring)."""
        cheapest, cost = self.costs.get((bucket, self.shapes[0])), self.costs.get((bucket, probe))
        if self.probe_budget is None or cheapest is None or cost is None:
            return self.probe_every
        return max(self.probe_every, (cost / cheapest - 1.0) / self.probe_budget)

    def observe(
        self, shape: DraftShape, accepted_drafts: list[int], request_ids: Sequence[str] = ()
    ) -> None:
        """One verify per request: how many of its drafts were accepted (the depth its accepted path reached);
        ``request_ids``, in the same order, also count it as each request's own."""
        if not shape.num_steps:
            return
        self._version += 1
        key = acceptance_key(shape)
        self._acceptance[key].observe(shape.num_steps, accepted_drafts, self.decay)
        for rid, accepted in zip(request_ids, accepted_drafts):
            own = self._own.setdefault(rid, {})
            if key not in own:
                own[key] = _DepthAcceptance(self._depths[key], 0.0, weight=0.0)
            own[key].observe(shape.num_steps, [accepted], self.decay)

    def forget(self, request_id: str) -> None:
        """The request finished or was preempted: drop its own counts."""
        if self._own.pop(request_id, None) is not None:
            self._version += 1

    def record_cost(self, bucket: int, shape: DraftShape, seconds: float) -> None:
        """A step's measured time: the first (a start-up profile, or a shape's first step) as given, later ones
        smoothed into it."""
        key = (bucket, shape)
        old = self.costs.get(key)
        self.costs[key] = (
            seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds
        )


def mean_steps(tokens: int, mean: float, width: int) -> float:
    """The verifies a request needs on average for its ``tokens``, each committing ``mean`` tokens: at least those
    that commit ``width`` tokens each (every draft accepted), at most one a token."""
    return min(float(tokens), max(float(math.ceil(tokens / width)), tokens / mean))


@cache
def max_of_normals(count: int) -> tuple[float, float]:
    """The mean and variance of the largest of ``count`` independent standard normal draws, by the trapezoid rule
    over its density count phi(x) Phi(x)^(count - 1) on [-8, 8] (0 and 1 for one draw; 1.42 and 0.37 for 8, 2.07
    and 0.24 for 32)."""
    step, first, second = 0.01, 0.0, 0.0
    for i in range(1601):  # (the ends' densities vanish: no half weights)
        x = -8.0 + i * step
        density = count * _density(x) * _below(x) ** (count - 1)
        first, second = first + x * density * step, second + x * x * density * step
    return first, second - first * first


def expected_largest(groups: Sequence[tuple[float, float, int]]) -> float:
    """E[max] of independent normal draws, in groups (mean, standard deviation, count) of draws alike: each
    group's largest as a normal of its moments (``max_of_normals``), then the groups' largest, from the largest
    mean down, by the moments of the larger of two normals (C. E. Clark, "The greatest of a finite set of random
    variables", Operations Research 9, 1961). Close to the integral of 1 - the product of the draws' distribution
    functions: within 0.02 of it for 32 draws of deviation 2 whose means spread by 1.5 around 40. (A loop over the
    groups, the distinct remaining counts: it runs for every shape at every step of a closed batch.)"""
    mean = var = 0.0
    for i, (mu, sd, count) in enumerate(sorted(groups, reverse=True)):
        z_mean, z_var = max_of_normals(count)
        mu, var_i = mu + sd * z_mean, sd * sd * z_var
        if i == 0:
            mean, var = mu, var_i
            continue
        theta = math.sqrt(var + var_i)
        alpha = (mean - mu) / theta if theta else math.inf
        if alpha > 8.0:  # (this group is never the largest)
            continue
        above, density = _below(alpha), theta * _density(alpha)
        first = mean * above + mu * (1.0 - above) + density
        second = (
            (mean * mean + var) * above + (mu * mu + var_i) * (1.0 - above) + (mean + mu) * density
        )
        mean, var = first, max(0.0, second - first * first)
    return mean


def _below(x: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _density(x: float) -> float:
    """The standard normal density."""
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
