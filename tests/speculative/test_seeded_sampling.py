"""Seeded sampling: a request with a seed gets the same tokens whatever runs it (issue 42, item 4).

Its output depends only on its prompt, sampling parameters and seed: not on the drafter, on the draft shape the
adaptive chooser picks, on whether speculation runs at all, on the requests batched with it (unseeded or seeded
otherwise) or their order, nor on preemption (a recomputed prefill samples the token a decode step would have).
And over many seeds its tokens still follow the target's processed distribution (chi-square, as the other
sampling tests). fp32 on the CPU, the zoo target and every zoo drafter; the tiny 5-token target for statistics.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from helpers.lossless_sampling import (
    LENGTH,
    PARAMS,
    PROMPT,
    SPECS,
    TRIALS,
    VOCAB,
    save_sampling_models,
)
from helpers.stats import chi_square_p_value, exact_joint
from helpers.zoo_drafters import TEST_DEVICE, zoo_drafters
from outpace import LLM, SamplingParams
from outpace.layers.sampler import (
    SamplingTensors,
    draw_gumbel,
    logits_to_probs,
    random_keys,
    sample,
)
from outpace.speculative.metrics import SpecMetrics
from outpace.speculative.verify import verify_chain, verify_tree

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TARGET = str(ZOO / "tinypy")
PROMPTS = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][16:19]
SEEDED = [
    SamplingParams(temperature=1.0, top_p=0.95, max_tokens=14, ignore_eos=True, seed=11),
    SamplingParams(temperature=0.8, top_k=20, max_tokens=14, ignore_eos=True, seed=2**40 + 3),
    SamplingParams(temperature=1.0, max_tokens=14, ignore_eos=True, seed=0),
]
DRAFTERS = {
    name: dataclasses.replace(spec, adaptive=True)
    for name, spec in zoo_drafters(chain_steps=4, tree=(3, 3, 8)).items()
}


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Each seeded request alone, plain decoding."""
    llm = LLM(TARGET, device=TEST_DEVICE, dtype="float32")
    return [llm.generate(p, params)[0].token_ids for p, params in zip(PROMPTS, SEEDED)]


def mixed_batch() -> tuple[list[str], list[SamplingParams]]:
    """The seeded requests (first), each prompt again unseeded and again with another seed."""
    others = [params.replace(seed=None) for params in SEEDED] + [
        params.replace(seed=params.seed + 1) for params in SEEDED
    ]
    return PROMPTS * 3, SEEDED + others


def cycle_shapes(llm: LLM, phase: int) -> None:
    """Every adaptive chooser takes the draft shapes in turn from ``phase`` on: runs differ in the shape of each
    step (the real chooser's pick depends on step timings, which differ from run to run anyway)."""
    shapes, turn = llm.engine.runner.shapes, iter(range(phase, 10**6))
    for chooser in llm.engine.choosers.values():
        chooser.choose = lambda bucket, ids, remaining=None: shapes[next(turn) % len(shapes)]


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_seeded_output_does_not_depend_on_speculation_or_companions(method, reference):
    llm = LLM(TARGET, device=TEST_DEVICE, dtype="float32", speculative=DRAFTERS[method])
    alone = [
        llm.generate(p, params)[0].token_ids for p, params in zip(PROMPTS, SEEDED)
    ]  # the real chooser
    assert alone == reference
    cycle_shapes(llm, phase=1)
    prompts, params = mixed_batch()
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs[: len(SEEDED)]] == reference
    assert [o.token_ids for o in outs[-len(SEEDED) :]] != reference  # the seed matters
    assert SpecMetrics.total(o.spec_metrics for o in outs).num_accepted_drafts > 0


@pytest.mark.parametrize("method", ["none"] + list(DRAFTERS))
def test_seeded_output_survives_preemption_in_either_batch_order(method, reference):
    spec = DRAFTERS.get(method)
    llm = LLM(
        TARGET,
        device=TEST_DEVICE,
        dtype="float32",
        num_kv_blocks=20,
        max_num_batched_tokens=128,
        **({"speculative": spec} if spec else {}),
    )
    prompts, params = mixed_batch()
    for phase, order in ((0, slice(None)), (2, slice(None, None, -1))):
        if spec is not None:
            cycle_shapes(llm, phase)
        outs = dict(zip(range(len(prompts))[order], llm.generate(prompts[order], params[order])))
        assert [outs[i].token_ids for i in range(len(SEEDED))] == reference, order
        assert sum(o.metrics.num_preemptions for o in outs.values()) > 0


# ---- statistics over seeds (the tiny 5-token target) -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_sampling_models(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("method", ["none", "eagle3-tree"])
def test_seeded_tokens_over_many_seeds_follow_the_target_distribution(method, tiny):
    llm = LLM(
        str(tiny["target"]),
        device=TEST_DEVICE,
        dtype="float32",
        block_size=4,
        num_kv_blocks=4096,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        speculative=dataclasses.replace(SPECS[method](tiny), adaptive=True),
    )
    if method != "none":
        cycle_shapes(llm, phase=0)
    outs = llm.generate([PROMPT] * TRIALS, [PARAMS.replace(seed=3 * i + 1) for i in range(TRIALS)])
    emitted = torch.tensor([o.token_ids for o in outs])  # [TRIALS, LENGTH]
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]
    counts = torch.bincount(index, minlength=VOCAB**LENGTH)
    p = chi_square_p_value(counts, TRIALS * exact_joint(tiny["target"], PROMPT, PARAMS, VOCAB))
    assert p > 1e-3, f"{method}: p = {p:.2e}"
    if method != "none":
        assert (
            sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0.05 * TRIALS
        )  # speculation really ran


# ---- the rule itself ---------------------------------------------------------------------------------------


def seeded_rows(temperature: list[float], seeded: list[bool]) -> SamplingTensors:
    params = [
        SamplingParams(temperature=t, seed=0 if s else None) for t, s in zip(temperature, seeded)
    ]
    return SamplingTensors.from_params(params, "cpu")


def test_a_seeded_row_samples_the_gumbel_max_of_its_position_in_any_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)  # [3, V]
    keys = random_keys(torch.tensor([5, 6, 7]), torch.tensor([40, 41, 42]))  # [3]
    st = seeded_rows([1.0, 0.7, 1.0], [True, True, False])
    tokens = sample(logits, st, keys)  # [3]
    probs = logits_to_probs(logits, st)
    expected = (probs.log() + draw_gumbel(keys, 50)).argmax(-1)
    assert tokens[:2].tolist() == expected[:2].tolist()
    flipped = sample(
        logits.flip(0), seeded_rows([1.0, 0.7, 1.0], [False, True, True]), keys.flip(0)
    )
    assert flipped.flip(0)[:2].tolist() == tokens[:2].tolist()  # the row's own, wherever it sits
    one = seeded_rows([0.7], [True])
    assert sample(logits[1:2], one, keys[1:2]).item() == tokens[1].item()


def test_verifying_a_seeded_row_is_exact_matching_against_its_sample():
    """Drafts equal to the target's own seeded samples are all accepted, and the bonus is the next sample; a
    draft that differs is rejected and the target's sample replaces it, whatever the draft probabilities say."""
    torch.manual_seed(1)
    vocab, num_drafts = 30, 3
    logits = torch.randn(1, num_drafts + 1, vocab)  # [1, n, V]
    st = seeded_rows([1.0], [True])
    gumbel = draw_gumbel(
        random_keys(torch.tensor([9] * (num_drafts + 1)), torch.arange(num_drafts + 1)), vocab
    )
    samples = (
        logits_to_probs(logits[0], st.repeat_interleave(num_drafts + 1)).log() + gumbel
    ).argmax(-1)  # [n]
    q = torch.full((1, num_drafts, vocab), 1.0 / vocab)
    keys = torch.tensor([123])
    full = verify_chain(samples[None, :-1], q, logits, st, keys, gumbel[None])
    assert full.output_token_ids[0].tolist() == samples.tolist()
    wrong = samples[:-1].clone()
    wrong[1] = (wrong[1] + 1) % vocab
    cut = verify_chain(wrong[None], q, logits, st, keys, gumbel[None])
    assert (
        cut.num_correct_drafts.tolist() == [1]
        and cut.output_token_ids[0, :2].tolist() == samples[:2].tolist()
    )
    # a tree whose node 1 is wrong and whose node 2 (its sibling) right: nodes at depth 1 share the noise
    parents = torch.tensor([[-1, 0, 0, 2]])
    tree_tokens = torch.tensor([[0, (samples[0] + 1) % vocab, samples[0], samples[1]]])
    depth_of = torch.tensor([0, 1, 1, 2])
    tree = verify_tree(
        parents,
        tree_tokens,
        None,
        logits[:, depth_of],
        st,
        keys,
        gumbel[depth_of][None],
        max_depth=2,
    )
    assert tree.output_token_ids[0].tolist() == samples[:3].tolist()
    assert tree.accepted_path[0].tolist() == [0, 2, 3]
