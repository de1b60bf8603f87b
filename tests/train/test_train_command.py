"""A draft's model card gives the command that trained it (train/model_card.py ``draft_train_command``): run
through the CLI's own parser, that command asks for the same recipe."""

import dataclasses

import pytest

from outpace.cli import build_parser
from outpace.cli.train import DRAFT_RECIPES, draft_recipe
from outpace.registry import resolve
from outpace.train.model_card import draft_train_command
from outpace.zoo import default_model


def _metrics(recipe, device: str = "NVIDIA H100 80GB HBM3", target: str | None = None) -> dict:
    import json

    return {
        "recipe": json.loads(json.dumps(dataclasses.asdict(recipe))),
        "device": device,
        "target": target
        or str(default_model()),  # the CLI's default: the zoo target's absolute path
    }


def _parsed(command: str):
    argv = command.split()
    assert argv[:3] == ["python", "-m", "outpace"]
    return draft_recipe(build_parser().parse_args(argv[3:]))


@pytest.mark.parametrize("method", sorted(DRAFT_RECIPES))
def test_default_recipe_gives_the_bare_command(method):
    cls = resolve({method: DRAFT_RECIPES[method][0]}, method, "draft recipe")
    command = draft_train_command(method, cls, _metrics(cls()), "OUT")
    assert (
        command
        == f"python -m outpace train draft --method {method} --target zoo/tinypy --out OUT --device cuda"
    )
    assert _parsed(command) == cls()


@pytest.mark.parametrize(
    "method, changes",
    [
        (
            "eagle3",
            dict(
                batch_size=128,
                num_continuations=32768,
                max_minutes=6.5,
                aux_layer_ids=(2, 4, 5),
                steps=900,
                seed=3,
                prompt_split="heldout",
            ),
        ),
        (
            "dflash",
            dict(
                data_temperature=0.0,
                num_layers=3,
                prompt_files=("a.jsonl", "b.txt"),
                max_minutes=None,
            ),
        ),
        ("mtp", dict(lr=5e-4, depth_decay=0.8, eval_prompts="p.json", soft_labels=False)),
    ],
)
def test_changed_fields_come_back_through_the_parser(method, changes):
    cls = resolve({method: DRAFT_RECIPES[method][0]}, method, "draft recipe")
    recipe = cls(**changes)
    command = draft_train_command(method, cls, _metrics(recipe, device="cpu"), "zoo/x")
    assert "--device cpu" in command
    assert _parsed(command) == recipe


def test_a_run_over_several_ranks_gives_their_count():
    cls = resolve({"eagle3": DRAFT_RECIPES["eagle3"][0]}, "eagle3", "draft recipe")
    command = draft_train_command("eagle3", cls, {**_metrics(cls()), "training_ranks": 2}, "OUT")
    assert command.endswith(" --nproc-per-node 2")
    assert build_parser().parse_args(command.split()[3:]).nproc_per_node == 2


def test_the_command_names_the_target_the_run_trained_against(tmp_path):
    """A zoo model as ``zoo/<name>`` wherever the zoo lies; any other directory as it was given."""
    cls = resolve({"mtp": DRAFT_RECIPES["mtp"][0]}, "mtp", "draft recipe")
    zoo_tinyds = str(default_model().parent / "tinyds")
    assert " --target zoo/tinyds " in draft_train_command(
        "mtp", cls, _metrics(cls(), target=zoo_tinyds), "OUT"
    )
    mine = str(tmp_path / "my-target")
    assert f" --target {mine} " in draft_train_command(
        "mtp", cls, _metrics(cls(), target=mine), "OUT"
    )
