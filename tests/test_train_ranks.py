"""Draft training over several ranks (outpace/train/ranks.py), on two CPU processes (gloo): the target
tensor-parallel over both, the EAGLE3 or DFlash draft data-parallel with FSDP. The two-rank run follows the
one-process run's loss curve and saves the same draft, which serves losslessly; a stopped two-rank run
resumes from its one state file to the draft of an uninterrupted run; what cannot be split is refused by name."""
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

import outpace.train.eagle3 as eagle3_module
from outpace.cli import main as cli_main
from outpace.config import SpeculativeConfig
from outpace.distributed.group import RankGroup
from outpace.train.dflash import DFlashRecipe, train_dflash
from outpace.train.eagle3 import Eagle3Recipe, train_eagle3
from outpace.train.ranks import RankFailed, TrainRanks, train_on_ranks

from test_dflash import peaked_target  # noqa: F401  (fixture: a random Llama with peaked outputs, <|mask|> = 2)

TRAIN = {"eagle3": train_eagle3, "dflash": train_dflash}


@pytest.fixture(scope="module")
def eval_prompts(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ranks_prompts") / "eval_prompts.json"
    path.write_text(json.dumps({"prompts": ["def f(x):\n    return", "class A:\n    def"]}))
    return str(path)


@pytest.fixture(scope="module")
def targets(tmp_path_factory, peaked_target, eval_prompts):  # noqa: F811
    """method -> (target directory, toy recipe): a trained toy target for EAGLE3 (six layers, as the zoo's);
    for DFlash a random target with peaked outputs and a mask token."""
    from outpace.train.target import TargetRecipe, train_target

    target_dir = tmp_path_factory.mktemp("ranks_target")
    train_target(TargetRecipe.toy(steps=30, num_layers=6), target_dir, "cpu", num_samples=1)
    return {"eagle3": (target_dir, Eagle3Recipe.toy(eval_prompts=eval_prompts, eval_num_steps=3, resume_every=10)),
            "dflash": (peaked_target, DFlashRecipe.toy(eval_prompts=eval_prompts, resume_every=10))}


@pytest.fixture(scope="module")
def trained(targets, tmp_path_factory):
    """trained(method, ranks) -> (draft directory, metrics) of the toy recipe over that many ranks (run once)."""
    done = {}

    def run(method: str, ranks: int):
        if (method, ranks) not in done:
            target_dir, recipe = targets[method]
            out = tmp_path_factory.mktemp(f"{method}_{ranks}_ranks")
            done[method, ranks] = out, train_on_ranks(TRAIN[method], ranks, "cpu", target_dir, recipe, out, "cpu")
        return done[method, ranks]
    return run


@pytest.mark.parametrize("method", sorted(TRAIN))
def test_two_ranks_follow_the_one_process_curve(trained, method):
    one, two = trained(method, 1)[1]["history"], trained(method, 2)[1]["history"]
    assert one["steps"] == two["steps"] and one["total_steps"] == two["total_steps"] == 30
    assert min(one["losses"][-2:]) < one["losses"][0] - 0.3  # it trains at all
    # the same gradients up to float summation order (the shares of the loss add up to the whole batch's)
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
    for name in one["extra"]:
        assert two["extra"][name] == pytest.approx(one["extra"][name], rel=1e-3, abs=1e-4), name
    assert two["tokens_seen"] == one["tokens_seen"]


@pytest.mark.parametrize("method", sorted(TRAIN))
def test_two_ranks_save_the_same_draft_and_it_serves_losslessly(trained, targets, method):
    from outpace import LLM, SamplingParams

    (dir_one, one), (dir_two, two) = trained(method, 1), trained(method, 2)
    w1, w2 = load_file(dir_one / "model.safetensors"), load_file(dir_two / "model.safetensors")
    assert w1.keys() == w2.keys() and "fc.weight" in w1
    for name in w1:  # bf16 weights: equal up to a rounding of the last bit
        torch.testing.assert_close(w2[name].float(), w1[name].float(), rtol=2e-2, atol=1e-3, msg=name)
    assert json.loads((dir_two / "config.json").read_text()) == json.loads((dir_one / "config.json").read_text())
    assert not (dir_two / "resume").exists() and (dir_two / "README.md").is_file()
    assert two["num_parameters"] == one["num_parameters"]  # FSDP's shards counted whole
    assert two["heldout"]["temperature 0"]["same_output_as_target"] == 1.0  # measured with a two-rank engine
    target_dir, recipe = targets[method]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 17, 3, 40], [9, 9, 101, 7, 64, 3]]
    expected = [o.token_ids for o in LLM(str(target_dir)).generate(prompts, greedy)]
    steps = recipe.block_size - 1 if method == "dflash" else 4
    spec = SpeculativeConfig(method, str(dir_two), num_steps=steps)
    assert [o.token_ids for o in LLM(str(target_dir), speculative=spec).generate(prompts, greedy)] == expected


def stopping_train(target_dir, recipe, out, device, ranks):
    """train_eagle3 that fails on every rank in its 16th step (state saved after steps 10)."""
    calls = {"n": 0}
    original = eagle3_module.ttt_losses

    def counting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 16:
            raise RuntimeError("stopped by the test")
        return original(*args, **kwargs)

    eagle3_module.ttt_losses = counting
    try:
        return train_eagle3(target_dir, recipe, out, device, ranks=ranks)
    finally:
        eagle3_module.ttt_losses = original


def test_a_stopped_two_rank_run_resumes_to_the_same_draft(trained, targets, tmp_path):
    """(EAGLE3 only: the state file is the training loop's, train/resume.py, the same for every recipe.)"""
    target_dir, recipe = targets["eagle3"]
    uninterrupted_dir, uninterrupted_metrics = trained("eagle3", 2)
    with pytest.raises((RuntimeError, RankFailed), match="stopped by the test|training ranks failed"):
        train_on_ranks(stopping_train, 2, "cpu", target_dir, recipe, tmp_path, "cpu")
    state = torch.load(tmp_path / "resume" / "state.pt", weights_only=False)
    assert state["step"] == 10 and state["ranks"] == 2  # one file, written by rank 0
    metrics = train_on_ranks(train_eagle3, 2, "cpu", target_dir, recipe, tmp_path, "cpu")
    uninterrupted_history = uninterrupted_metrics["history"]
    assert metrics["history"]["steps"] == uninterrupted_history["steps"]
    assert metrics["history"]["losses"] == pytest.approx(uninterrupted_history["losses"], rel=1e-5)
    resumed, uninterrupted = load_file(tmp_path / "model.safetensors"), load_file(uninterrupted_dir / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:  # bf16 weights: equal, or one rounding of the last bit apart
        torch.testing.assert_close(resumed[name].float(), uninterrupted[name].float(), rtol=1e-2, atol=1e-3, msg=name)


def test_what_does_not_split_is_refused_by_name(targets, tmp_path):
    with pytest.raises(ValueError, match="batch_size=5 does not split over 2 training ranks"):
        TrainRanks(RankGroup(0, 2)).rows(5)
    target_dir, _ = targets["eagle3"]
    with pytest.raises(SystemExit, match="--method mtp trains in one process only"):
        cli_main(["train", "draft", "--method", "mtp", "--toy", "--target", str(target_dir), "--out",
                  str(tmp_path), "--device", "cpu", "--nproc-per-node", "2"])
    assert not any(tmp_path.iterdir())  # refused before anything ran



def test_a_failure_on_rank_0_stops_every_rank_with_its_reason(targets, tmp_path):
    """Rank 0 fails while the other rank serves its engines (prompt files that do not exist): the error is
    raised here and the other rank stops too, instead of waiting for an engine that never comes."""
    target_dir, recipe = targets["eagle3"]
    missing = str(tmp_path / "no_such_prompts.jsonl")
    with pytest.raises((FileNotFoundError, ValueError), match="no_such_prompts"):
        train_on_ranks(train_eagle3, 2, "cpu", target_dir, dataclasses.replace(recipe, prompt_files=(missing,)),
                       tmp_path / "out", "cpu")
    assert not (tmp_path / "out" / "model.safetensors").exists()
