"""What a draft training run is checked against before it generates any data, each refused by name: every
recipe field against its annotated type (``check_field_types``), the directories and files it reads and writes
(``check_run``), and, on resuming, the run a saved state or cached data belongs to (``run_identity``). The
target recipes (train/target.py, train/family_targets.py) share the first and the --out part of the second
(``check_out_dir``), and refuse their fields' ranges in the same words (``check_field``)."""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path

from outpace.train.evaluate import heldout_prompts_file, load_prompts


def _fits(value, hint) -> bool:
    """Whether ``value`` is of the annotated type ``hint`` (the kinds recipe fields have: int, float, bool, str,
    None, tuple[X, ...] and unions of them; any other annotation is not checked)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return isinstance(value, tuple) and all(_fits(v, args[0]) for v in value)
        return isinstance(value, tuple)
    return True


def _kind(hint) -> str:
    """``hint`` in words (a field's refusal says what it must be)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_kind(arg) for arg in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        return (
            f"a list of {_kind(args[0]).removeprefix('a ').removeprefix('an ')}s"
            if args
            else "a list"
        )
    words = {
        type(None): "None (null)",
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
    }
    return words.get(hint, str(hint))


def check_field_types(recipe) -> None:
    """Refuse, naming it, a field of the dataclass ``recipe`` whose value is not of its annotated type (a --set
    VALUE is read as JSON: ``lr=abc`` is a string, ``steps=1.5`` a float, ``compile_step=1`` an integer)."""
    try:
        hints = typing.get_type_hints(type(recipe))
    except Exception:  # an annotation that does not resolve: nothing to check against
        return
    for f in dataclasses.fields(recipe):
        value = getattr(recipe, f.name)
        if f.name in hints and not _fits(value, hints[f.name]):
            raise ValueError(
                f"{type(recipe).__name__}.{f.name}={value!r} is invalid: must be {_kind(hints[f.name])}"
            )


def check_field(recipe, name: str, ok: bool, allowed: str) -> None:
    """Refuse the field ``name`` of ``recipe`` unless ``ok``: ``allowed`` says what it must be (the words of
    train/distill.py ``DistillRecipe.check``, for recipes that are not draft recipes)."""
    if not ok:
        raise ValueError(
            f"{type(recipe).__name__}.{name}={getattr(recipe, name)!r} is invalid: must be {allowed}"
        )


def check_training_fields(recipe) -> None:
    """The ranges of the fields every recipe (draft or target) trains by: its steps, batch, learning rate and its
    schedule, time budget and seed."""
    for name in ("steps", "batch_size"):
        check_field(recipe, name, getattr(recipe, name) >= 1, ">= 1")
    check_field(recipe, "lr", math.isfinite(recipe.lr) and recipe.lr > 0, "a finite number > 0")
    check_field(recipe, "warmup_steps", recipe.warmup_steps >= 0, ">= 0")
    minutes = recipe.max_minutes
    check_field(recipe, "max_minutes", minutes is None or minutes > 0, "None or > 0")
    check_field(recipe, "seed", recipe.seed >= 0, ">= 0")


def check_out_dir(out_dir: Path, inputs: tuple[tuple[str, Path, str], ...] = ()) -> None:
    """Refuse, before a run does any work, an ``out_dir`` that exists and is not a directory, that is one of the
    run's input directories (``inputs``: (its flag or name, the directory, what writing there would do)), or
    that cannot be written (or, not existing yet, created in its nearest existing parent)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir}: exists and is not a directory")
    for name, directory, why in inputs:
        if out_dir.resolve() == Path(directory).resolve():
            raise ValueError(f"--out {out_dir} must differ from {name}: {why}")
    existing = next(d for d in (out_dir, *out_dir.absolute().parents) if d.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out_dir}: {existing} is not a writable directory")


def check_run(recipe, target_dir: Path, out_dir: Path) -> None:
    """What a draft run reads and writes, checked before it generates any data, each refused by name: ``out_dir``
    must be a directory (or not exist yet) that can be written, and not the target's own (the draft's
    config.json and weights would overwrite the target's; ``check_out_dir``); the held-out prompts
    (``eval_prompts``, else the zoo's beside the target) must load; the prompt files and corpus directories must
    exist."""
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    target_why = "it is the target's directory, whose config.json and weights the draft's files would overwrite"
    check_out_dir(out_dir, (("--target", target_dir, target_why),))
    type_name = type(recipe).__name__
    for f in recipe.prompt_files or ():
        if not Path(f).is_file():
            raise FileNotFoundError(f"--data {f}: no such file")
    for root in recipe.corpus_roots or ():
        if not Path(root).is_dir():
            raise FileNotFoundError(f"{type_name}.corpus_roots: {root} is not a directory")
    prompts_file = heldout_prompts_file(target_dir, recipe.eval_prompts)
    if prompts_file is not None:
        load_prompts(prompts_file)


# Recipe fields a resumed run may change: its time budget, how often it saves, how its steps and data generation
# run, and its held-out evaluation. Every other field, the recipe (the method) and the target shape the saved
# training state or data, and a state saved by a run that differs in any of them is refused (``run_identity``).
RESUMABLE_FIELDS = (
    "max_minutes",
    "total_minutes",
    "heldout_reserve_minutes",
    "resume_every",
    "compile_step",
    "generation_batch",
    "eval_prompts",
    "eval_max_tokens",
    "eval_num_prompts",
    "eval_num_steps",
)
# The fields that the target's continuations (the data a run caches) depend on.
DATA_FIELDS = (
    "num_continuations",
    "prompt_len",
    "new_tokens",
    "seed",
    "max_corpus_bytes",
    "corpus_roots",
    "data_temperature",
    "prompt_split",
    "prompt_files",
)


def _paths(value):
    return None if value is None else tuple(str(Path(v).resolve()) for v in value)


def run_identity(recipe, target_dir: Path, fields: tuple[str, ...] | None = None) -> dict:
    """What a saved training state (or, with ``fields`` = DATA_FIELDS, the cached data) belongs to: the recipe
    class, the target's directory and the recipe's fields (``fields``; None: all but RESUMABLE_FIELDS), paths
    resolved. The held-out prompts count when the prompts' split is "heldout", which leaves their files out."""
    values = dataclasses.asdict(recipe)
    names = fields or tuple(k for k in values if k not in RESUMABLE_FIELDS)
    identity = {
        "recipe": type(recipe).__name__,
        "target": str(Path(target_dir).resolve()),
        **{k: values[k] for k in names},
    }
    for k in ("prompt_files", "corpus_roots"):
        if k in identity:
            identity[k] = _paths(identity[k])
    if recipe.prompt_split == "heldout":
        identity["eval_prompts"] = _paths((recipe.eval_prompts,) if recipe.eval_prompts else None)
    if fields is not None:  # the data is the same for every recipe class
        identity.pop("recipe")
    return identity


def identity_mismatch(saved: dict | None, current: dict) -> str | None:
    """None when a file saved for ``saved`` (None: a file of an older outpace, which carries none) may be read by
    the run ``current``; else the differences in words."""
    if saved is None or saved == current:
        return None
    keys = sorted(set(saved) | set(current), key=lambda k: (k not in ("recipe", "target"), k))
    return ", ".join(
        f"{k} {saved.get(k)!r} there, {current.get(k)!r} now"
        for k in keys
        if saved.get(k) != current.get(k)
    )
