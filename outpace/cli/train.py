"""``outpace train target | draft``: train the zoo models (zoo/README.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from outpace.cli.engine_args import check_model_dir
from outpace.registry import resolve
from outpace.zoo import default_model

# NOTE: the training modules are imported in the functions that run them: the parser (and
# `outpace --help`) loads no torch.

# --method -> (recipe class, training function), imported lazily; each trains over any number of ranks
DRAFT_RECIPES = {
    "standalone": (
        "outpace.train.recipes.standalone:StandaloneRecipe",
        "outpace.train.recipes.standalone:train_standalone",
    ),
    "eagle3": (
        "outpace.train.recipes.eagle3:Eagle3Recipe",
        "outpace.train.recipes.eagle3:train_eagle3",
    ),
    "dflash": (
        "outpace.train.recipes.dflash:DFlashRecipe",
        "outpace.train.recipes.dflash:train_dflash",
    ),
    "mtp": ("outpace.train.recipes.mtp:MTPRecipe", "outpace.train.recipes.mtp:train_mtp"),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train the zoo models (see zoo/README.md)")
    tsub = t.add_subparsers(dest="what", required=True)
    tt = tsub.add_parser("target", help="a small Llama code model with chained MTP layers")
    add_recipe_args(tt)
    tt.add_argument(
        "--reproduce-steps",
        type=int,
        default=None,
        metavar="N",
        help="instead of training: run the recipe's first N (>= 1) steps twice and compare the curves",
    )
    tt.set_defaults(func=run_target)
    td = tsub.add_parser("draft", help="a draft for a trained target")
    td.add_argument("--method", required=True, choices=list(DRAFT_RECIPES))
    td.add_argument(
        "--target", default=None, help="the target's directory (default: the zoo target)"
    )
    td.add_argument(
        "--data",
        nargs="+",
        default=None,
        metavar="FILE",
        help="prompt files, read by suffix: .jsonl: one record per line; .json: a list of records; any "
        "other: plain text cut into prompt windows (a record: a string, or an object with "
        "prompt/text/input/question, or with messages/conversations, ShareGPT's form too); the "
        "target regenerates the responses (default: the zoo corpus)",
    )
    td.add_argument(
        "--eval-prompts",
        default=None,
        help="JSON list of held-out prompts for the final acceptance run (default: the zoo's)",
    )
    td.add_argument("--num-continuations", type=int, help="continuations the target generates")
    td.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="training ranks started here (every --method): the target tensor-parallel over them, the "
        "draft (mtp: the MTP layers) data-parallel with FSDP; or launch with torchrun "
        "--nproc-per-node N",
    )
    add_recipe_args(td)
    td.set_defaults(func=run_draft)


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    """Flags every recipe takes; --steps, --max-minutes, --seed and --set override the recipe's values."""
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N (default: cuda)")
    p.add_argument("--toy", action="store_true", help="CPU-sized recipe (seconds)")
    p.add_argument("--steps", type=int)
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other recipe field (VALUE read as JSON, else as a string); repeatable",
    )


def check_device(device: str) -> None:
    """Refuse a --device that training cannot run on before the recipe makes any data: cpu, or a CUDA
    device torch sees."""
    import torch

    if device == "cpu":
        return
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"--device {device!r} is invalid: must be cpu, cuda or cuda:N")
    index = int(device[5:] or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"--device {device}: torch {torch.__version__} sees {torch.cuda.device_count()} GPUs here "
            "(train on the CPU with --device cpu)"
        )


def recipe_overrides(a: argparse.Namespace, names: tuple[str, ...]) -> dict:
    return {n: getattr(a, n) for n in names if getattr(a, n, None) is not None}


def run_target(a: argparse.Namespace) -> None:
    from outpace.train.target import TargetRecipe, reproducibility_check, train_target

    check_device(a.device)
    overrides = with_set_fields(recipe_overrides(a, ("steps", "max_minutes", "seed")), a.set)
    try:
        recipe = TargetRecipe.toy(**overrides) if a.toy else TargetRecipe(**overrides)
    except TypeError as e:  # a --set field the recipe does not have
        raise ValueError(f"TargetRecipe: {e}") from None
    if a.reproduce_steps is not None:  # (0 is refused, not taken for "train")
        result = reproducibility_check(recipe, a.reproduce_steps, a.device, Path(a.out))
        print(json.dumps({k: result[k] for k in ("max_abs_diff", "mean_abs_diff", "device")}))
        return
    metrics = train_target(recipe, Path(a.out), a.device)
    keys = (
        "heldout_loss",
        "heldout_top1",
        "mtp_heldout_top1",
        "train_wall_seconds",
        "num_parameters",
    )
    print(json.dumps({k: metrics[k] for k in keys}, indent=2))


def draft_recipe(a: argparse.Namespace):
    """The recipe that ``train draft``'s arguments ask for (the model cards write them back:
    train/model_card.py ``draft_train_command``)."""
    recipe_cls = resolve({a.method: DRAFT_RECIPES[a.method][0]}, a.method, "draft recipe")
    names = ("steps", "max_minutes", "seed", "eval_prompts", "num_continuations")
    overrides = recipe_overrides(a, names)
    if a.data:
        overrides["prompt_files"] = tuple(a.data)
    overrides = with_set_fields(overrides, a.set)
    try:
        return recipe_cls.toy(**overrides) if a.toy else recipe_cls(**overrides)
    except TypeError as e:  # a --set field the recipe does not have
        raise ValueError(f"{recipe_cls.__name__}: {e}") from None


def run_draft(a: argparse.Namespace) -> None:
    from outpace.train.ranks import train_on_ranks

    check_device(a.device)
    a.target = a.target or str(default_model())
    check_model_dir(a.target)
    train_fn = resolve({a.method: DRAFT_RECIPES[a.method][1]}, a.method, "draft recipe")
    recipe = draft_recipe(a)
    metrics = train_on_ranks(
        train_fn, a.nproc_per_node, a.device, Path(a.target), recipe, Path(a.out), a.device
    )
    if metrics is None:  # a rank > 0 of a torchrun launch: rank 0 prints
        return
    keys = (
        "final_loss",
        "final_step_top1",
        "final_position_top1",
        "final_layer_top1",
        "train_wall_seconds",
        "num_parameters",
    )
    summary = {k: metrics[k] for k in keys if k in metrics}
    for name, row in metrics.get("heldout", {}).items():
        if name.startswith("temperature"):
            summary[f"heldout tau ({name})"] = row["acceptance_length"]
    print(json.dumps(summary, indent=2))


def with_set_fields(flags: dict, pairs: list[str]) -> dict:
    """The recipe fields the named flags give (``flags``) and --set gives (``pairs``): a field both give is
    refused, naming both, rather than --set silently winning."""
    fields = field_values(pairs)
    for name in sorted(flags.keys() & fields.keys()):
        flag = "--data" if name == "prompt_files" else f"--{name.replace('_', '-')}"
        raise ValueError(
            f"--set {name}={fields[name]!r} and {flag} both set the recipe's {name}: give one"
        )
    return {**flags, **fields}


def field_values(pairs: list[str]) -> dict:
    """["field=value", ...] -> {field: value}, values read as JSON when they parse (lists become tuples)."""
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected FIELD=VALUE")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[name.replace("-", "_")] = tuple(value) if isinstance(value, list) else value
    return out
