"""Draft training over several ranks (outpace/train/ranks.py), on two CPU processes (gloo): the target
tensor-parallel over both; the EAGLE3, DFlash or standalone draft, or the target's own MTP layers (a whole copy
on each rank), data-parallel with FSDP. The two-rank run follows the one-process run's loss curve and saves the
same draft, which serves losslessly; a stopped two-rank run resumes from its one state file to the draft of an
uninterrupted run; what cannot be split is refused by name."""

import dataclasses
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.rank_zero_apart import train_on_ranks_apart
from outpace.cli import main as cli_main
from outpace.config import SpeculativeConfig
from outpace.distributed.group import RankGroup
from outpace.train.ranks import RankFailed, TrainRanks
from outpace.train.recipes.dflash import DFlashRecipe, train_dflash
from outpace.train.recipes.eagle3 import Eagle3Recipe, train_eagle3
from outpace.train.recipes.mtp import MTPRecipe, train_mtp
from outpace.train.recipes.standalone import StandaloneRecipe, train_standalone

TRAIN = {
    "eagle3": train_eagle3,
    "dflash": train_dflash,
    "mtp": train_mtp,
    "standalone": train_standalone,
}


@pytest.fixture(scope="module")
def targets(peaked_target, toy_eval_prompts, trained_toy_target, mtp_toy_target):
    """method -> (target directory, toy recipe): a trained toy target for EAGLE3 and the standalone draft (six
    layers, as the zoo's); for DFlash a random target with peaked outputs and a mask token; for MTP a toy
    target whose MTP layers were scrambled (something to learn). The targets are conftest.py's, built once
    per session.

    NOTE: the standalone draft (a whole model trained from its random start) takes lr 3e-3, not its toy 1e-2.
    At 1e-2 its run is chaotic: the two runs' gradients differ by float summation order alone (3e-7 of their
    norm at step 0); Adam's first step turns that into weight differences of 1e-5 (gradient entries of ~5e-9,
    below Adam's eps of 1e-8, move by about lr * g / eps), and by step 19 they have grown to 4e-3, beyond
    bf16's rounding: the saved drafts differed on every run on an AMD EPYC (AVX2), busy or not. At 3e-3 they
    differ by 6e-8 and the loss still falls by 0.75."""
    target_dir = trained_toy_target(6)[0]
    # the corpus of one stdlib package: the whole stdlib and site-packages (the default) are read on every run
    run = dict(resume_every=10, corpus_roots=(str(Path(sysconfig.get_paths()["stdlib"]) / "json"),))
    return {
        "eagle3": (
            target_dir,
            Eagle3Recipe.toy(eval_prompts=toy_eval_prompts, eval_num_steps=3, **run),
        ),
        "dflash": (peaked_target, DFlashRecipe.toy(eval_prompts=toy_eval_prompts, **run)),
        "mtp": (mtp_toy_target, MTPRecipe.toy(eval_prompts=toy_eval_prompts, **run)),
        "standalone": (target_dir, StandaloneRecipe.toy(lr=3e-3, **run)),
    }


@pytest.fixture(scope="module")
def trained(targets, tmp_path_factory):
    """trained(method, ranks) -> (draft directory, metrics) of the toy recipe over that many ranks (run once)."""
    done = {}

    def run(method: str, ranks: int):
        if (method, ranks) not in done:
            target_dir, recipe = targets[method]
            out = tmp_path_factory.mktemp(f"{method}_{ranks}_ranks")
            done[method, ranks] = (
                out,
                train_on_ranks_apart(TRAIN[method], ranks, "cpu", target_dir, recipe, out, "cpu"),
            )
        return done[method, ranks]

    return run


@pytest.mark.parametrize("method", sorted(TRAIN))
def test_two_ranks_follow_the_one_process_curve(trained, targets, method):
    one, two = trained(method, 1)[1]["history"], trained(method, 2)[1]["history"]
    assert (
        one["steps"] == two["steps"]
        and one["total_steps"] == two["total_steps"] == targets[method][1].steps
    )
    assert min(one["losses"][-2:]) < one["losses"][0] - 0.3  # it trains at all
    # the same gradients up to float summation order (the shares of the loss add up to the whole batch's)
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
    for name in one["extra"]:
        assert two["extra"][name] == pytest.approx(one["extra"][name], rel=1e-3, abs=1e-4), name
    assert two["tokens_seen"] == one["tokens_seen"]


def served(method: str, target_dir, trained_dir, recipe) -> tuple[str, SpeculativeConfig]:
    """(the model to serve, the speculative config) of what a run of ``method`` saved in ``trained_dir``."""
    if method == "mtp":  # the target's copy with its MTP layers fine-tuned
        return str(trained_dir), SpeculativeConfig("mtp", num_steps=3)
    steps = recipe.block_size - 1 if method == "dflash" else 4
    return str(target_dir), SpeculativeConfig(
        "draft" if method == "standalone" else method, str(trained_dir), num_steps=steps
    )


@pytest.mark.parametrize("method", sorted(TRAIN))
def test_two_ranks_save_the_same_draft_and_it_serves_losslessly(trained, targets, method):
    from outpace import LLM, SamplingParams

    target_dir, recipe = targets[method]
    (dir_one, one), (dir_two, two) = trained(method, 1), trained(method, 2)
    w1, w2 = load_file(dir_one / "model.safetensors"), load_file(dir_two / "model.safetensors")
    assert w1.keys() == w2.keys()
    for name in w1:  # bf16 weights: equal up to a rounding of the last bit
        torch.testing.assert_close(
            w2[name].float(), w1[name].float(), rtol=2e-2, atol=1e-3, msg=name
        )
    if method == "mtp":  # the same tensors moved in both runs, the MTP layers' q/k/v among them
        before = load_file(target_dir / "model.safetensors")
        moved = [{k for k in w if not torch.equal(w[k], before[k])} for w in (w1, w2)]
        assert moved[0] == moved[1] and "model.layers.2.self_attn.q_proj.weight" in moved[0]
    assert json.loads((dir_two / "config.json").read_text()) == json.loads(
        (dir_one / "config.json").read_text()
    )
    assert not (dir_two / "resume").exists() and (dir_two / "README.md").is_file()
    assert two["num_parameters"] == one["num_parameters"]  # FSDP's shards counted whole
    assert (one["training_ranks"], two["training_ranks"]) == (1, 2)
    card = (dir_two / "README.md").read_text()
    assert "--nproc-per-node 2" in card and "(2 training ranks)" in card
    if method != "standalone":  # (the standalone recipe measures no held-out acceptance)
        assert (
            two["heldout"]["temperature 0"]["same_output_as_target"] == 1.0
        )  # measured with a two-rank engine
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 17, 3, 40], [9, 9, 101, 7, 64, 3]]
    expected = [o.token_ids for o in LLM(str(target_dir)).generate(prompts, greedy)]
    model, spec = served(method, target_dir, dir_two, recipe)
    assert [o.token_ids for o in LLM(model, speculative=spec).generate(prompts, greedy)] == expected


def stopping_train(method, target_dir, recipe, out, device, ranks):
    """TRAIN[method] that fails on every rank in its 16th step (state saved after steps 10)."""
    calls = {"n": 0}
    original = torch.nn.utils.clip_grad_norm_  # the training loop calls it once a step

    def counting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 16:
            raise RuntimeError("stopped by the test")
        return original(*args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = counting
    try:
        return TRAIN[method](target_dir, recipe, out, device, ranks=ranks)
    finally:
        torch.nn.utils.clip_grad_norm_ = original


@pytest.mark.parametrize("method", ["eagle3", "mtp", "standalone"])
def test_a_stopped_two_rank_run_resumes_to_the_same_draft(trained, targets, tmp_path, method):
    """(The state file is the training loop's, train/resume.py, for every recipe; DFlash's FSDP module is
    EAGLE3's kind, a draft of its own, while MTP's is a part of the target, the standalone draft a whole model.)"""
    target_dir, recipe = targets[method]
    uninterrupted_dir, uninterrupted_metrics = trained(method, 2)
    with pytest.raises(
        (RuntimeError, RankFailed), match="stopped by the test|training ranks failed"
    ):
        train_on_ranks_apart(stopping_train, 2, "cpu", method, target_dir, recipe, tmp_path, "cpu")
    state = torch.load(tmp_path / "resume" / "state.pt", weights_only=False)
    assert state["step"] == 10 and state["ranks"] == 2  # one file, written by rank 0
    metrics = train_on_ranks_apart(TRAIN[method], 2, "cpu", target_dir, recipe, tmp_path, "cpu")
    uninterrupted_history = uninterrupted_metrics["history"]
    assert metrics["history"]["steps"] == uninterrupted_history["steps"]
    assert metrics["history"]["losses"] == pytest.approx(uninterrupted_history["losses"], rel=1e-5)
    resumed, uninterrupted = (
        load_file(tmp_path / "model.safetensors"),
        load_file(uninterrupted_dir / "model.safetensors"),
    )
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:  # bf16 weights: equal, or one rounding of the last bit apart
        torch.testing.assert_close(
            resumed[name].float(), uninterrupted[name].float(), rtol=1e-2, atol=1e-3, msg=name
        )


def test_what_does_not_split_is_refused_by_name(targets, tmp_path):
    with pytest.raises(ValueError, match="batch_size=5 does not split over 2 training ranks"):
        TrainRanks(RankGroup(0, 2)).rows(5)
    target_dir, _ = targets["mtp"]
    with pytest.raises(
        SystemExit, match="MTPRecipe.batch_size=5 does not split over 2 training ranks"
    ):
        cli_main(
            [
                "train",
                "draft",
                "--method",
                "mtp",
                "--toy",
                "--target",
                str(target_dir),
                "--out",
                str(tmp_path),
                "--device",
                "cpu",
                "--nproc-per-node",
                "2",
                "--set",
                "batch_size=5",
            ]
        )
    assert not any(tmp_path.iterdir())  # refused on every rank before anything ran


def test_a_failure_on_rank_0_stops_every_rank_with_its_reason(targets, tmp_path):
    """Rank 0 fails while the other rank serves its engines (prompt files that do not exist): the error is
    raised here and the other rank stops too, instead of waiting for an engine that never comes."""
    target_dir, recipe = targets["eagle3"]
    missing = str(tmp_path / "no_such_prompts.jsonl")
    with pytest.raises((FileNotFoundError, ValueError), match="no_such_prompts"):
        train_on_ranks_apart(
            train_eagle3,
            2,
            "cpu",
            target_dir,
            dataclasses.replace(recipe, prompt_files=(missing,)),
            tmp_path / "out",
            "cpu",
        )
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_spawned_rank_leaks_no_semaphore():
    """A spawned rank leaves through os._exit (train/ranks.py ``_spawned_rank``): its progress bars must not
    hold a multiprocessing semaphore, which the resource tracker reports as leaked when the run exits."""
    code = (
        "from outpace.train.ranks import train_on_ranks\n"
        "from helpers.spawned_ranks import bars_on_every_rank\n"
        "assert train_on_ranks(bars_on_every_rank, 2, 'cpu', 3) == 3\n"
    )
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(tests.parent), str(tests)])
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert run.returncode == 0, run.stderr
    assert "leaked semaphore" not in run.stderr, run.stderr
