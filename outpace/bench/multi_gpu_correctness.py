"""``bench multi``'s ``correctness`` part (bench/multi_gpu.py's docstring), and its checks that ``item1`` runs
too: TP = world greedy tokens against TP = 1's (``tp_equality_items``), the drafters lossless at TP = world
(``lossless_items``), and the random checkpoints they compare (``random_written``). Each is a function of
rank 0's ``Run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from outpace.bench.gpu import ZOO_DRAFTERS
from outpace.bench.multi_gpu_measures import compare, tau
from outpace.bench.multi_gpu_plan import Case, family_drafts, prompts_for, zoo_draft
from outpace.config import SpeculativeConfig
from outpace.zoo import zoo_dir

if TYPE_CHECKING:
    from outpace.bench.multi_gpu import Run


def correctness(run: Run) -> None:
    plan, world = run.plan, run.group.world
    section = run.result.setdefault(
        "correctness", {"tokens": plan.tokens, "tp": world, "tp_equality": [], "lossless": []}
    )
    zoo = zoo_dir()
    cases = [
        Case(name, str(zoo / name))
        for name in plan.zoo_targets
        if (zoo / name / "config.json").is_file()
    ]
    shape = plan.shapes[plan.random_shape]
    random_dir = run.workdir / f"random-{plan.random_shape}"
    if random_written(run, "correctness", random_dir, shape):
        cases.append(Case(f"random-{plan.random_shape}", str(random_dir)))
    cost = {f"random-{plan.random_shape}": plan.item_seconds(shape)}
    plain = tp_equality_items(run, "correctness", section, [*cases, *plan.cases], cost)
    drafts = [
        ("tinypy", str(zoo / "tinypy"), name, zoo_draft(ZOO_DRAFTERS[name]))
        for name in plan.drafters
    ]
    lossless_items(
        run, "correctness", section, drafts + family_drafts(plan.family_drafters), plain, {}
    )


def random_written(run: Run, part: str, out: Path, config: dict) -> bool:
    """Write the random checkpoint of ``config`` into ``out`` (an item of ``part``; again on a fresh
    machine); whether it is there."""
    writing = f"{part}: write the random checkpoint" + (
        "" if part == "correctness" else f" {out.name}"
    )
    if not (out / "config.json").is_file() and writing in run.result["done"]:
        run.result["done"].remove(writing)  # continued on a fresh machine: written again
    run.item(
        writing, 10 + config["num_hidden_layers"], lambda: _random_checkpoint(run, out, config)
    )
    return (out / "config.json").is_file()


def tp_equality_items(
    run: Run, part: str, section: dict, cases: list[Case], cost: dict[str, float]
) -> dict[str, list]:
    """TP = world greedy tokens of each case against TP = 1's (items of ``part``; ``cost``: seconds per
    engine by case name, 15 by default); returns the TP = world fp32 tokens by case (the drafters'
    reference), and sets the section's fp32 verdict."""
    plan, world = run.plan, run.group.world
    plain: dict[str, list] = {}
    for case in cases:
        vocab = json.loads((Path(case.model) / "config.json").read_text())["vocab_size"]
        prompts = prompts_for(case.model, plan.prompts, vocab)
        for dtype in case.dtypes:

            def row(case=case, dtype=dtype, prompts=prompts) -> None:
                reference = [
                    o.token_ids
                    for o in run.generate(case.reference or case.model, prompts, dtype, 1)
                ]
                outs = run.generate(case.model, prompts, dtype, world)
                if dtype == "float32" and case.reference is None:
                    plain[case.name] = [o.token_ids for o in outs]
                against = (
                    "TP = 1" if case.reference is None else f"TP = 1 of {Path(case.reference).name}"
                )
                run.add(
                    section["tp_equality"],
                    {
                        "model": case.name,
                        "dtype": dtype,
                        "tp": world,
                        "reference": against,
                        **compare(reference, outs),
                    },
                )

            run.item(f"{part}: {case.name} {dtype}", 2 * cost.get(case.name, 15.0), row)
    rows = section["tp_equality"]
    section["all_tp_equal_fp32"] = (
        all(r["equal"] for r in rows if r["dtype"] == "float32") if rows else None
    )
    return plain


def lossless_items(
    run: Run,
    part: str,
    section: dict,
    drafts: list[tuple[str, str, str, SpeculativeConfig]],
    plain: dict[str, list],
    cost: dict[str, float],
) -> None:
    """Each (target name, target directory, drafter name, its config) at TP = world in fp32 against plain
    decoding at TP = world (``plain``: tokens by target name, measured here when missing); items of
    ``part``, ``cost`` seconds per engine by target name (15 by default); sets the section's verdict."""
    plan, world = run.plan, run.group.world
    for target, model, name, spec in drafts:

        def lossless(target=target, model=model, name=name, spec=spec) -> None:
            vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
            prompts = prompts_for(model, plan.prompts, vocab)
            if target not in plain:
                plain[target] = [
                    o.token_ids for o in run.generate(model, prompts, "float32", world)
                ]
            outs = run.generate(model, prompts, "float32", world, spec)
            row = compare(plain[target], outs)
            if row["first_mismatch"]:
                prompt, position = row["first_mismatch"]
                row["plain_top2_gap"] = _top2_gap(run, model, prompts[prompt], position)
            run.add(
                section["lossless"],
                {
                    "drafter": name,
                    "target": target,
                    "dtype": "float32",
                    "tp": world,
                    "tau": tau(outs),
                    **row,
                },
            )

        run.item(f"{part}: {target} {name} lossless", cost.get(target, 15.0), lossless)
    section["all_lossless_fp32"] = (
        all(r["equal"] for r in section["lossless"]) if section["lossless"] else None
    )


def _top2_gap(run: Run, model: str, prompt, position: int) -> float | None:
    """How near a tie plain decoding (TP = world, fp32) is at ``position`` of ``prompt``'s output: its two
    most likely tokens' log-probability gap there (run alone, so a batch's sums may differ from the
    compared run's by rounding). A gap at rounding size says the drafter's tokens differ where the
    verify forward's sums (another batch shape) flip a tie, not where speculation changed the output."""
    (out,) = run.generate(model, [prompt], "float32", run.group.world, logprobs=2)
    if out.logprobs is None or position >= len(out.logprobs):
        return None
    top = sorted((x.logprob for x in out.logprobs[position].values() if x.rank <= 2), reverse=True)
    return top[0] - top[1] if len(top) == 2 else None


def _random_checkpoint(run: Run, out: Path, shape: dict) -> None:
    from outpace.bench.random_checkpoint import random_target

    random_target(out, shape, device=run.plan.device)
