"""Adaptive speculation (speculative/adaptive.py): the draft shape (chain length, tree width) changes from
step to step, output stays lossless, and a drafter whose drafts are useless ends up not drafting at all."""

import json
from pathlib import Path

import pytest

from helpers.oracle_proposer import OracleProposer
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.registry import PROPOSERS
from outpace.speculative.adaptive import (
    DraftLengthChooser,
    _ReachRows,
    expected_largest,
    max_of_normals,
    mean_steps,
)
from outpace.speculative.proposer import DraftShape, draft_shapes

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"
ZOO = "zoo/tinypy"
EAGLE3 = SpeculativeConfig("eagle3", "zoo/tinypy-eagle3", num_steps=5, adaptive=True)
EAGLE3_TREE = SpeculativeConfig(
    "eagle3", "zoo/tinypy-eagle3", topk=4
)  # adaptive: 5 steps, 16 nodes


def _prompts(n: int) -> list[str]:
    return json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"][:n]


def test_config_is_adaptive_unless_the_shape_is_given():
    assert SpeculativeConfig("ngram").adaptive and SpeculativeConfig("ngram").num_steps == 5
    assert not SpeculativeConfig("ngram", num_steps=3).adaptive
    assert draft_shapes(SpeculativeConfig("ngram", num_steps=3)) == (DraftShape(3),)
    assert [s.num_steps for s in draft_shapes(SpeculativeConfig("ngram"))] == [0, 1, 2, 3, 4, 5]
    tree = SpeculativeConfig("eagle3", "d", num_steps=4, topk=2, num_draft_tokens=8, adaptive=True)
    assert draft_shapes(tree) == (*(DraftShape(k) for k in range(5)), DraftShape(4, 2, 8))
    # a wide tree also offers its narrower trees of the same depth and nodes, the most nodes last
    assert EAGLE3_TREE.adaptive and (EAGLE3_TREE.num_steps, EAGLE3_TREE.num_draft_tokens) == (5, 16)
    assert draft_shapes(EAGLE3_TREE) == (
        *(DraftShape(k) for k in range(6)),
        DraftShape(5, 2, 16),
        DraftShape(5, 4, 16),
    )
    # topk 4 at depth 2 fills 16 nodes (1 + 4 + 16 candidates), topk 2 cannot (1 + 2 + 4): not offered
    shallow = SpeculativeConfig(
        "eagle3", "d", num_steps=2, topk=4, num_draft_tokens=16, adaptive=True
    )
    assert draft_shapes(shallow)[-2:] == (DraftShape(2), DraftShape(2, 4, 16))


def test_chooser_takes_the_best_tokens_per_second():
    shapes = [DraftShape(k) for k in range(4)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k, cost in enumerate((1.0, 1.2, 1.4, 1.6)):
        chooser.record_cost(1, DraftShape(k), cost)
    for _ in range(200):  # drafts 1 and 2 always accepted, draft 3 never
        chooser.observe(DraftShape(3), [2])
    # E(k) = 1, 2, 3, 3 tokens for 1.0, 1.2, 1.4, 1.6: k = 2 is best
    assert [round(a, 2) for a in chooser.acceptance()] == [1.0, 1.0, 0.0]
    assert chooser.choose(1) == DraftShape(2)
    for _ in range(400):  # now nothing is accepted: plain decoding wins
        chooser.observe(DraftShape(3), [0])
    assert chooser.choose(1) == DraftShape(0)


def test_each_request_keeps_its_own_acceptance_and_the_batch_takes_their_mean():
    """A request that accepts everything and one that accepts nothing, verified together: the batch-wide rates
    are their mixture; alone, each follows its own (the first drafts the longest chain, the second none), a
    new request follows the batch, and a finished one's counts are dropped."""
    shapes = [DraftShape(k) for k in range(4)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k in range(4):
        chooser.record_cost(2, DraftShape(k), 1.0 + 0.1 * k)
    for _ in range(300):
        chooser.observe(DraftShape(3), [3, 0], ["repeats", "sampled"])
    assert chooser.acceptance(None, "repeats") == pytest.approx(
        [1.0, 1.0, 1.0], abs=0.03
    )  # the prior: 4 of ~104
    assert chooser.acceptance(None, "sampled") == pytest.approx(
        [0.0, 1.0, 1.0], abs=0.03
    )  # 2-3: the batch-wide
    assert chooser.expected_tokens(DraftShape(3), ["repeats"]) == pytest.approx(4, abs=0.1)
    assert chooser.expected_tokens(DraftShape(3), ["repeats", "sampled"]) == pytest.approx(
        2.5, abs=0.1
    )
    assert chooser.choose(2, ["repeats"]) == DraftShape(3)
    assert chooser.choose(2, ["sampled"]) == DraftShape(
        0
    )  # the tail of a closed batch: plain decoding
    assert chooser.choose(2, ["new"]) == chooser.choose(2)  # no history: the batch-wide choice
    chooser.forget("sampled")
    assert chooser.acceptance(None, "sampled") == chooser.acceptance()


def test_a_closed_batch_is_timed_by_its_slowest_request():
    """With requests waiting the step maximises throughput (the batch's mean tokens per second); with none
    waiting it minimises the time to the batch's last token. A request that accepts everything and one that
    accepts nothing, with as many tokens left: throughput drafts for the first, but the batch ends when the
    second does, which drafts cannot hasten, so the closed batch decodes plainly. Once the second has few
    tokens left, the first is the slowest and drafting pays again."""
    shapes = [DraftShape(k) for k in range(4)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k in range(4):
        chooser.record_cost(2, DraftShape(k), 1.0 + 0.1 * k)
    for _ in range(300):
        chooser.observe(DraftShape(3), [3, 0], ["repeats", "sampled"])
    ids = ["repeats", "sampled"]
    assert chooser.choose(2, ids) == DraftShape(3)  # throughput: E = 2.5 tokens for 1.3
    assert chooser.choose(2, ids, remaining=[100, 100]) == DraftShape(0)
    # "sampled" needs 10 steps whatever the shape; "repeats" 100 plain steps, 25 of depth 3
    assert chooser.choose(2, ids, remaining=[100, 10]) == DraftShape(3)
    # a closed batch of one is timed by itself: the same choice as throughput's
    assert chooser.choose(2, ["repeats"], remaining=[50]) == chooser.choose(2, ["repeats"])


def _chooser_at_batch_32(first_depth_rate: float) -> tuple[DraftLengthChooser, list[str]]:
    """Chains to 4 at the H200's n-gram step costs at batch 32 (ms, benchmarks/results/gpu_2026-12-01b call 4),
    after 32 requests verified 40 chains of 4 each, every one accepting all 4 drafts with probability
    ``first_depth_rate`` (a seeded draw) and none otherwise: rates that differ by chance only, so shared."""
    import random

    chooser = DraftLengthChooser([DraftShape(k) for k in range(5)], probe_every=1000)
    for k, cost in enumerate((5.05, 5.50, 5.57, 5.83, 6.22)):
        chooser.record_cost(32, DraftShape(k), cost)
    ids, rng = [f"r{i}" for i in range(32)], random.Random(0)
    for _ in range(40):
        chooser.observe(DraftShape(4), [4 * (rng.random() < first_depth_rate) for _ in ids], ids)
    return chooser, ids


def test_a_closed_batch_s_last_steps_decode_plainly_where_drafts_rarely_land():
    """A closed batch of 32 whose drafts land 1 time in 5: with 3 tokens left each, a verify's expected 1.2
    tokens would make 2.5 steps of 3, but every request must accept a draft for the batch to end a step
    sooner, so the batch takes its 3 steps whatever it drafts, and plain steps are the cheapest (with the
    expected tokens alone it drafted there: gpu_2026-12-01b call 4). Over a long budget the same rates
    still draft, and a batch whose drafts mostly land drafts to its end but for the last token."""
    chooser, ids = _chooser_at_batch_32(0.2)
    assert chooser.choose(32, ids, remaining=[3] * 32) == DraftShape(0)
    assert chooser.choose(32, ids, remaining=[300] * 32).num_steps > 0
    sure, ids = _chooser_at_batch_32(0.9)
    assert sure.choose(32, ids, remaining=[3] * 32).num_steps > 0
    assert sure.choose(32, ids, remaining=[1] * 32) == DraftShape(0)  # one verify either way


def test_requests_of_differing_rates_wait_for_the_lowest_one_s_mean():
    """Where the requests' rates differ beyond chance (half accept every draft, half one in two), the batch's
    steps are the slowest request's budget over its mean tokens a verify: the quantile is for requests of one
    rate (with it, the mixed batch of call 5 in gpu_2026-12-01b stopped drafting greedy n-gram: 1.03x steady
    where 1.91x had been measured)."""
    import random

    chooser = DraftLengthChooser([DraftShape(k) for k in range(5)], probe_every=1000)
    ids, rng = [f"r{i}" for i in range(32)], random.Random(1)
    for _ in range(40):
        chooser.observe(
            DraftShape(4), [4 if i % 2 or rng.random() < 0.5 else 0 for i in range(32)], ids
        )
    shape = DraftShape(4)
    lowest = min(chooser.expected_tokens(shape, [r]) for r in ids)
    assert lowest < 3.0  # the half that accepts one in two
    steps = chooser._steps_to_finish(shape, ids, [100] * 32)
    assert steps == pytest.approx(100 / lowest)


def test_mean_steps_and_the_largest_of_normal_draws():
    """A request's mean verifies, never fewer than accepting every draft takes nor more than one a token; the
    largest of normal draws against its known values and a simulation of draws whose means differ."""
    import random
    import statistics

    assert mean_steps(300, 1.2, 2) == pytest.approx(250.0)
    assert (
        mean_steps(3, 1.2, 2) == 2.5
        and mean_steps(3, 0.5, 2) == 3.0
        and mean_steps(2, 3.9, 4) == 1.0
    )
    assert max_of_normals(1) == pytest.approx((0.0, 1.0), abs=1e-9)
    assert max_of_normals(2) == pytest.approx(
        (1 / 3.141592653589793**0.5, 1 - 1 / 3.141592653589793)
    )
    assert max_of_normals(32)[0] == pytest.approx(
        2.0697, abs=1e-3
    )  # (tables of normal order statistics)
    assert expected_largest([(40.0, 2.0, 32)]) == pytest.approx(40.0 + 2.0 * 2.0697, abs=1e-3)
    rng = random.Random(0)
    groups = [(40.0 + rng.gauss(0.0, 1.5), 2.0, 1) for _ in range(31)] + [(30.0, 2.0, 1)]
    drawn = statistics.mean(
        max(rng.gauss(mu, sd) for mu, sd, _ in groups) for _ in range(20000)
    )  # [the simulated E[max]]
    assert expected_largest(groups) == pytest.approx(drawn, abs=0.05)
    # a group of 31 alike draws is its 31 draws
    drawn = statistics.mean(
        max(max(rng.gauss(40.0, 2.0) for _ in range(31)), rng.gauss(35.0, 1.0))
        for _ in range(20000)
    )
    assert expected_largest([(40.0, 2.0, 31), (35.0, 1.0, 1)]) == pytest.approx(drawn, abs=0.05)


def test_a_closed_batch_counts_a_request_s_bad_luck_once():
    """A closed batch that has drafted: its requests' remaining tokens differ by the luck of those verifies. Their
    steps to the end are the expected largest of their own step counts, not each one's count at the unluckiest
    quantile: that counted the request already behind as unlucky once more, so a batch that had begun to draft
    judged drafting on as losing and held, having paid the drafting steps' extra time for nothing (simulated in
    benchmarks/scripts/closed_batch_spread.py). Here, a batch whose rates make one draft a step pay from the
    start keeps drafting once its requests' remaining tokens spread as ten such verifies spread them."""
    import random

    chooser = DraftLengthChooser([DraftShape(0), DraftShape(1)], probe_every=1000)
    chooser.record_cost(32, DraftShape(0), 8.24e-3)  # Qwen3.5's widened EAGLE3 at batch 32 (H100,
    chooser.record_cost(32, DraftShape(1), 10.7e-3)  # benchmarks/results/gpu_2026-12-06 call 34)
    ids, rng = [f"r{i}" for i in range(32)], random.Random(0)
    for _ in range(40):
        chooser.observe(DraftShape(1), [int(rng.random() < 0.5) for _ in ids], ids)
    assert chooser.choose(32, ids, remaining=[64] * 32) == DraftShape(1)
    rng = random.Random(3)
    for verifies in (15, 20):
        left = [64 - sum(1 + (rng.random() < 0.5) for _ in range(verifies)) for _ in ids]  # [32]
        assert max(left) - min(left) >= 7
        assert chooser.choose(32, ids, remaining=left) == DraftShape(1)


def test_a_closed_batch_near_its_end_defers_its_probe_for_one_spacing():
    """A probe informs the choices after it: a closed batch with fewer steps left than the probes' spacing
    defers it, for one spacing at most (the chooser outlives the batch: closed batches no longer than the
    spacing would never be probed); one with more steps left takes it when due, as does a batch with requests
    waiting."""

    def due() -> DraftLengthChooser:
        chooser = DraftLengthChooser([DraftShape(k) for k in range(3)], probe_every=4)
        for k in range(3):
            chooser.record_cost(2, DraftShape(k), 1.0 + 0.5 * k)
        for _ in range(100):
            chooser.observe(DraftShape(2), [0, 0], ["a", "b"])
        for _ in range(3):
            assert chooser.choose(2, ["a", "b"]) == DraftShape(0)
        return chooser

    assert due().choose(2, ["a", "b"], remaining=[3, 3]) == DraftShape(0)
    deferred = due()
    shapes = [deferred.choose(2, ["a", "b"], remaining=[3, 3]) for _ in range(5)]
    assert shapes == [DraftShape(0)] * 4 + [DraftShape(1)]  # the 8th step since the last probe
    assert due().choose(2, ["a", "b"], remaining=[50, 50]) == DraftShape(1)
    assert due().choose(2, ["a", "b"]) == DraftShape(1)


def test_requests_whose_rates_differ_by_chance_share_the_batch_s_rate():
    """32 requests that all accept a draft with probability 0.78 (a seeded draw), 2 verifies each: their own
    rates scatter by chance (one accepted nothing), and the slowest-looking one alone would hold the closed
    batch at plain decoding (E < 2.09 for 2 drafts at twice the cost); their spread is the binomial noise, so
    they share their pooled rate and the batch keeps drafting. A real split (half accept everything, half
    nothing) still leaves each request its own rates: the closed batch decodes plainly."""
    import random

    shapes = [DraftShape(k) for k in range(3)]
    ids = [f"r{i}" for i in range(32)]
    rng = random.Random(0)

    def chooser_after(accepts) -> DraftLengthChooser:
        chooser = DraftLengthChooser(shapes, probe_every=1000)
        for k, cost in enumerate(
            (6.28, 10.73, 12.75)
        ):  # the H200's step ms at batch 32 (Qwen3.5, MTP)
            chooser.record_cost(32, DraftShape(k), cost)
        for k in range(300):
            chooser.observe(
                DraftShape(2), [accepts(1 + k % 31)]
            )  # the batch-wide rates, learned first
        for _ in range(2):
            chooser.observe(DraftShape(2), [accepts(i) for i in range(32)], ids)
        return chooser

    def chance(
        i: int,
    ) -> int:  # request 0 rejects both times (a 1-in-20 chance that 32 requests make likely)
        return 0 if i == 0 or rng.random() > 0.78 else 1 if rng.random() > 0.78 else 2

    shared = chooser_after(chance)
    lowest = min(shared.expected_tokens(DraftShape(2), [r]) for r in ids)
    assert lowest < 2.09  # alone, the unluckiest request would stop the drafts
    assert shared.choose(32, ids, remaining=[100] * 32) == DraftShape(2)
    split = chooser_after(lambda i: 2 * (i % 2))
    assert split.choose(32, ids, remaining=[100] * 32) == DraftShape(0)


def test_requests_of_one_rate_are_one_row_of_reaches():
    """A batch whose requests share their rates keeps one row of reaches for them all (_ReachRows: a closed batch
    of 32 asks for them at every step), with a one-request batch's figures and the batch's mean; requests whose
    rates differ keep a row each."""
    rates = [0.8, 0.7, 0.6, 0.5]
    alike, lone = _ReachRows([rates] * 32), _ReachRows([rates])
    assert alike.alike and len(alike.reaches) == 1
    for k in range(1, 5):
        assert alike.tokens_per_verify(k) == lone.tokens_per_verify(k)
        assert alike.variance_per_verify(k) == lone.variance_per_verify(k)
    assert alike.mean == pytest.approx(lone.mean, rel=1e-12)
    differ = _ReachRows([rates, [0.4, 0.3, 0.2, 0.1]])
    assert not differ.alike and len(differ.tokens_per_verify(2)) == 2
    assert differ.mean[0] == pytest.approx((0.8 + 0.4) / 2)


def test_a_lone_request_unlucky_in_its_first_verifies_keeps_the_batch_wide_rate():
    """Batch 1, closed: a request whose first drafts landed 2 times in 6, where the requests before it landed 7 in
    10, is within the binomial noise of that rate and keeps drafting (its own counts blended in would leave 0.46
    and plain decoding for the rest of its tokens, which teach nothing); one whose first drafts landed 2 times in
    16 is not, and decodes plainly."""
    shapes = [DraftShape(k) for k in range(3)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k, cost in enumerate(
        (2.69, 3.87, 4.33)
    ):  # the widened DeepSeek's step ms (gpu_2026-12-01j)
        chooser.record_cost(1, DraftShape(k), cost)
    for i in range(
        300
    ):  # earlier requests: first drafts land 7 times in 10, second ones 2 of those 7
        chooser.observe(DraftShape(2), [(i % 10 < 7) + (i % 10 < 2)], [f"before-{i // 30}"])
    for landed in (1, 1, 0, 0, 0, 0):
        chooser.observe(DraftShape(1), [landed], ["unlucky"])
    assert chooser.acceptance(DraftShape(1), "unlucky")[0] == pytest.approx(0.46, abs=0.01)
    assert chooser.choose(1, ["unlucky"], remaining=[56]) == DraftShape(1)
    for _ in range(10):
        chooser.observe(DraftShape(1), [0], ["unlucky"])
    assert chooser.choose(1, ["unlucky"], remaining=[46]) == DraftShape(0)


def test_a_drafter_judged_on_a_few_unlucky_verifies_is_tried_again():
    """Batch 1, closed, the widened DeepSeek's step costs: a first request whose first drafts landed once in six
    verifies leaves a batch-wide first-draft rate of 0.34 on ten verifies' counts (the prior's four included).
    Taken at that, the next request would decode plainly, and plain steps teach nothing (bench e2e's MTP row at
    temperature 0.8 did so for its whole run, 0.98x plain decoding); a choice reads the rates one standard error
    up, 0.48 here, so it drafts, and learns. Where many verifies show the drafts rarely land, that bound is near
    the rate and the chooser decodes plainly."""
    shapes = [DraftShape(k) for k in range(3)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k, cost in enumerate((2.69, 3.87, 4.33)):  # ms (gpu_2026-12-01j)
        chooser.record_cost(1, DraftShape(k), cost)
    for landed in (0, 0, 1, 0, 0, 0):
        chooser.observe(DraftShape(2), [landed], ["first"])
    chooser.forget("first")
    assert chooser.acceptance()[0] == pytest.approx(0.34, abs=0.01)
    assert chooser.choose(1, ["next"], remaining=[64]) == DraftShape(2)
    for i in range(100):  # first drafts land 3 times in 10, second ones never
        chooser.observe(DraftShape(2), [int(i % 10 < 3)], [f"later-{i // 25}"])
    assert chooser.choose(1, ["last"], remaining=[64]) == DraftShape(0)


def test_adaptive_ngram_never_loses_a_closed_batch_to_plain_decoding():
    """The engine tells the chooser when nothing is waiting: a closed batch whose requests n-gram drafts help
    unevenly decodes plainly once the slowest of them gains nothing (the steps it drafts cost more and end no
    sooner), while a batch with requests waiting keeps the throughput rule. Output stays lossless."""
    llm = LLM(ZOO, speculative=SpeculativeConfig("ngram"), max_num_seqs=4)
    plain = LLM(ZOO, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=48)
    prompts = _prompts(4)
    seen = []
    chooser = next(iter(llm.engine.runner.choosers.values()))
    real = chooser.choose

    def spy(bucket, request_ids=(), remaining=None):
        shape = real(bucket, request_ids, remaining)
        seen.append((remaining is not None, shape.num_steps))
        return shape

    chooser.choose = spy
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(prompts, params)]
    assert seen and all(closed for closed, _ in seen)  # 4 prompts, 4 rows: nothing ever waits
    seen.clear()
    llm.generate(_prompts(8), params)  # 8 prompts, 4 rows: the first steps have requests waiting
    assert not seen[0][0] and seen[-1][0]


def test_a_choice_reads_the_acceptance_observed_since_the_last_choice():
    """The requests' reaches are kept from one choice to the next while nothing is observed (a run of steps
    with no drafts); an observed verify, or a finished request, is seen by the very next choice."""
    shapes = [DraftShape(k) for k in range(3)]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for k in range(3):
        chooser.record_cost(2, DraftShape(k), 1.0 + 0.5 * k)
    ids = ["a", "b"]
    for _ in range(100):
        chooser.observe(DraftShape(2), [0, 0], ids)
    assert chooser.choose(2, ids) == DraftShape(0)
    assert chooser.choose(2, ids, remaining=[50, 50]) == DraftShape(0)
    for _ in range(300):
        chooser.observe(DraftShape(2), [2, 2], ids)
    assert chooser.choose(2, ids) == DraftShape(2)
    assert chooser.choose(2, ids, remaining=[50, 50]) == DraftShape(2)
    for _ in range(300):
        chooser.observe(DraftShape(2), [2, 0], ["c", "b"])  # "b" now rejects every draft
    assert chooser.choose(2, ids, remaining=[50, 50]) == DraftShape(0)  # "b" is the slowest
    assert chooser.expected_tokens(DraftShape(1), ["b"]) < 1.1  # its own: it rejects
    chooser.forget("b")  # its own counts go: it follows the batch-wide rates (0.5 at depth 1)
    assert chooser.expected_tokens(DraftShape(1), ["b"]) == pytest.approx(
        chooser.expected_tokens(DraftShape(1)), abs=1e-9
    )


def test_trees_keep_their_own_acceptance_and_the_cheapest_rate_wins():
    """A tree's accepted path reaches each depth more often than a chain's: each tree shape keeps its own
    acceptance, so a narrow tree that accepts more is chosen over a wide one at the same cost, and a chain
    once the trees cost too much for the batch."""
    chain, narrow, wide = DraftShape(5), DraftShape(5, 2, 16), DraftShape(5, 4, 16)
    shapes = [DraftShape(k) for k in range(6)] + [narrow, wide]
    chooser = DraftLengthChooser(shapes, probe_every=1000)
    for _ in range(300):
        chooser.observe(chain, [1])  # chains: draft 1 accepted, draft 2 never
        chooser.observe(narrow, [4])  # the narrow tree reaches depth 4
        chooser.observe(wide, [3])  # the wide one depth 3
    assert [round(a, 2) for a in chooser.acceptance()] == [
        1.0,
        0.0,
        0.6,
        0.6,
        0.6,
    ]  # (depths never tried: prior)
    assert chooser.expected_tokens(narrow) == pytest.approx(5, abs=0.01)
    assert chooser.expected_tokens(wide) == pytest.approx(4, abs=0.01)
    assert chooser.expected_tokens(DraftShape(3)) == pytest.approx(2, abs=0.01)
    for k in range(6):  # small batch: every shape costs about the same
        chooser.record_cost(1, DraftShape(k), 1.0 + 0.01 * k)
    chooser.record_cost(1, narrow, 1.1)
    chooser.record_cost(1, wide, 1.1)
    assert chooser.choose(1) == narrow
    for k in range(6):  # large batch: 16 verified nodes per request cost three times a step of 2
        chooser.record_cost(32, DraftShape(k), 1.0 + 0.1 * k)
    chooser.record_cost(32, narrow, 3.0)
    chooser.record_cost(32, wide, 3.0)
    assert chooser.choose(32) == DraftShape(1)  # 2 tokens for 1.1 beats 5 for 3.0


def test_probes_take_a_chain_one_draft_deeper_and_each_tree_in_turn():
    """The chain probe is one draft past the chain last chosen (a depth is reached only through the one before
    it), then each tree in turn; where the longest chain is chosen, every depth is measured already and only the
    trees are probed."""
    narrow, wide = DraftShape(5, 2, 16), DraftShape(5, 4, 16)
    chooser = DraftLengthChooser([DraftShape(k) for k in range(6)] + [wide, narrow], probe_every=2)
    for k, s in enumerate(chooser.shapes):
        chooser.record_cost(1, s, 1.0 + k)  # steep: plain decoding is chosen
    probes = [chooser.choose(1) for _ in range(12)][1::2]
    assert probes == [DraftShape(1), narrow, wide] * 2
    for _ in range(50):  # draft 1 always lands, draft 2 never: one draft is chosen
        chooser.observe(DraftShape(2), [1])
    chooser.record_cost(1, DraftShape(1), 1.1)
    assert chooser.choose(1) == DraftShape(1)
    assert [chooser.choose(1) for _ in range(6)][::2] == [DraftShape(2), narrow, wide]
    for _ in range(
        200
    ):  # now draft 1 never lands: plain decoding again, and the next chain probe one draft
        chooser.observe(DraftShape(1), [0])
    assert [chooser.choose(1) for _ in range(8)] == [
        *(DraftShape(2), DraftShape(0), narrow, DraftShape(0), wide, DraftShape(0)),
        *(DraftShape(1), DraftShape(0)),
    ]
    cheap = DraftLengthChooser([DraftShape(k) for k in range(6)] + [wide, narrow], probe_every=2)
    for s in cheap.shapes:  # every shape at one cost: the longest chain is chosen
        cheap.record_cost(1, s, 1.0)
    for _ in range(100):
        cheap.observe(DraftShape(5), [5])
        cheap.observe(narrow, [0])
        cheap.observe(wide, [0])
    assert cheap.choose(1) == DraftShape(5)
    assert [cheap.choose(1) for _ in range(8)][::2] == [narrow, wide] * 2


def test_every_unknown_cost_is_tried_once_and_probes_refresh_acceptance():
    shapes = [DraftShape(k) for k in range(3)]
    chooser = DraftLengthChooser(shapes, probe_every=4)
    tried = []
    for _ in range(3):
        shape = chooser.choose(8)
        tried.append(shape)
        chooser.record_cost(8, shape, 1.0 + shape.num_steps)
    assert sorted(s.num_steps for s in tried) == [0, 1, 2]
    assert (
        chooser.choose(8) == shapes[1]
    )  # the 4th step is a probe: one draft past plain decoding's


@pytest.mark.parametrize("spec", [EAGLE3, EAGLE3_TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lossless_while_the_number_of_drafts_changes(temperature, spec):
    """A chooser forced through every shape in turn (for a tree: every chain length and both tree widths):
    greedy output equals plain decoding, token for token; sampled requests run through every shape too
    (their distribution is checked against the target's, with the shapes changing, in
    test_lossless_sampling.py's eagle3-adaptive case)."""
    prompts = _prompts(4)
    params = SamplingParams(temperature=temperature, max_tokens=40, ignore_eos=True, seed=1)
    llm = LLM(ZOO, max_num_seqs=4, speculative=spec)
    shapes, turn, used = llm.engine.runner.shapes, iter(range(10**6)), set()
    for chooser in llm.engine.choosers.values():
        chooser.choose = lambda bucket, ids, remaining=None: (
            used.add(shape := shapes[next(turn) % len(shapes)]) or shape
        )
    outs = llm.generate(prompts, params)
    assert used == set(shapes) and len(shapes) == (6 if spec is EAGLE3 else 8)
    seen = [n for o in outs for n, c in enumerate(o.spec_metrics.verifies_by_num_drafts) if c]
    assert {0, 1, 2, 3, 4, 5} <= set(seen)
    assert all(len(o.token_ids) == 40 for o in outs)
    if temperature == 0:
        expected = LLM(ZOO, max_num_seqs=4).generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in expected]


def test_useless_drafts_are_not_drafted(monkeypatch):
    """An oracle whose every draft is wrong: after trying each shape, the steps draft nothing but the
    probes (one step in 64). The steps' costs are a fixed model here (each verified token adds a tenth
    of a step), so that the choice follows acceptance alone, not a busy CPU's timing noise."""
    record = DraftLengthChooser.record_cost
    monkeypatch.setattr(
        DraftLengthChooser,
        "record_cost",
        lambda self, bucket, shape, seconds: record(
            self, bucket, shape, 1.0 + 0.1 * shape.num_nodes
        ),
    )
    prompts = _prompts(2)
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    expected = LLM(ZOO).generate(prompts, params)
    monkeypatch.setattr(OracleProposer, "corruption", 1.0)
    llm = LLM(ZOO, speculative=SpeculativeConfig("oracle", None, num_steps=4, adaptive=True))
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    by_drafts = outs[0].spec_metrics.verifies_by_num_drafts
    assert by_drafts[0] >= 0.9 * sum(by_drafts), by_drafts
