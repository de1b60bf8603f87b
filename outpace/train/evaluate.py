"""The end of every draft recipe: acceptance of the saved draft, loaded through the serving path, on
held-out prompts, at temperature 0 (with the check that the output is the target's own) and 1.

The prompts are the zoo's ``eval_prompts.json`` (cut from held-out files, never trained on) when the
target sits in the zoo, or any JSON file of the same form (a list, or ``{"prompts": [...]}``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from outpace.config import SpeculativeConfig
from outpace.sampling_params import SamplingParams
from outpace.speculative.metrics import SpecMetrics
from outpace.train.metrics_file import write_metrics
from outpace.train.ranks import ONE_RANK, TrainRanks


def heldout_prompts_file(target_dir: Path, given: str | None) -> Path | None:
    """``given`` when set; else the ``eval_prompts.json`` beside the target's directory (the zoo's), if any."""
    if given is not None:
        return Path(given)
    beside = Path(target_dir).resolve().parent / "eval_prompts.json"
    return beside if beside.is_file() else None


def load_prompts(path: Path) -> list[str]:
    """The prompts of a held-out prompts file: a JSON list of strings, or ``{"prompts": [...]}``; a file of
    another form is refused naming it (train/run_checks.py ``check_run`` reads it before a run's data)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"held-out prompts (eval_prompts) {path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"held-out prompts (eval_prompts) {path}: not JSON ({e})") from None
    prompts = data.get("prompts") if isinstance(data, dict) else data
    if not (
        isinstance(prompts, list) and prompts and all(isinstance(p, str) and p for p in prompts)
    ):
        raise ValueError(
            f"held-out prompts (eval_prompts) {path}: must be a non-empty JSON list of non-empty strings, "
            'or an object {"prompts": [...]} holding one'
        )
    return prompts


def heldout_acceptance(
    target_dir: Path,
    spec: SpeculativeConfig,
    prompts: list,
    max_tokens: int,
    device: str,
    seed: int = 0,
    ranks: TrainRanks = ONE_RANK,
) -> dict:
    """{"temperature 0": {...}, "temperature 1": {...}}: tau, acceptance by draft position, and at
    temperature 0 the share of prompts whose output equals the target's alone (1.0 in fp32 on the CPU).
    The engines are tensor-parallel over the training ``ranks`` (rank 0 calls this; train/ranks.py)."""
    engine = dict(
        device=device, seed=seed, cuda_graphs=False
    )  # a few dozen steps: capturing would cost more
    results = {}
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
        with ranks.open_llm(str(target_dir), speculative=spec, **engine) as llm:
            outs = llm.generate(prompts, params)
        metrics = SpecMetrics.total(o.spec_metrics for o in outs)
        row = {
            "acceptance_length": metrics.acceptance_length,
            "acceptance_rate_per_position": metrics.acceptance_rate_per_position,
        }
        if temperature == 0.0:
            with ranks.open_llm(str(target_dir), **engine) as llm:
                plain = llm.generate(prompts, params)
            row["same_output_as_target"] = sum(
                o.token_ids == p.token_ids for o, p in zip(outs, plain)
            ) / len(outs)
        results[f"temperature {temperature:g}"] = row
    return results


def acceptance_table(evaluation: dict) -> str:
    """The card's Markdown table of a ``heldout_acceptance`` result."""
    rows = [
        f"| {name} | {r['acceptance_length']:.2f} | "
        f"{' '.join(f'{x:.2f}' for x in r['acceptance_rate_per_position'])} |"
        for name, r in evaluation.items()
    ]
    return "\n".join(["| sampling | tau | acceptance by draft position |", "|---|---|---|", *rows])


def finish_with_heldout(
    out_dir: Path,
    serve_target: Path,
    spec: SpeculativeConfig,
    recipe,
    metrics: dict,
    write_card,
    device: str,
    started: float,
    prompts_near: Path | None = None,
    ranks: TrainRanks = ONE_RANK,
) -> dict:
    """The last step of a draft recipe: held-out acceptance of what it saved (``serve_target`` + ``spec``,
    loaded as serving loads them), added to ``metrics`` (``heldout``) and written into out_dir's
    training_metrics.json and card. Nothing is measured when no held-out prompts are known (the recipe's
    ``eval_prompts``, else the zoo's ``eval_prompts.json`` beside ``prompts_near`` or ``serve_target``).
    Over several training ranks rank 0 measures, with engines over them all, and every rank gets the result."""
    return ranks.on_driver(
        lambda: _measure_heldout(
            out_dir,
            serve_target,
            spec,
            recipe,
            metrics,
            write_card,
            device,
            started,
            prompts_near,
            ranks,
        )
    )


def _measure_heldout(
    out_dir: Path,
    serve_target: Path,
    spec: SpeculativeConfig,
    recipe,
    metrics: dict,
    write_card,
    device: str,
    started: float,
    prompts_near: Path | None,
    ranks: TrainRanks,
) -> dict:
    prompts_file = heldout_prompts_file(prompts_near or serve_target, recipe.eval_prompts)
    if prompts_file is None:
        return metrics
    prompts = load_prompts(prompts_file)[: recipe.eval_num_prompts]
    metrics["heldout"] = dict(
        prompts=str(prompts_file),
        num_prompts=len(prompts),
        max_tokens=recipe.eval_max_tokens,
        device=device,
        spec=f"--method {spec.method} --num-steps {spec.num_steps}",
        **heldout_acceptance(
            serve_target, spec, prompts, recipe.eval_max_tokens, device, ranks=ranks
        ),
    )
    metrics["total_wall_seconds"] = time.perf_counter() - started
    write_metrics(out_dir, metrics)
    write_card(Path(out_dir), metrics)
    return metrics


def heldout_section(metrics: dict) -> str:
    """The card's "Held-out acceptance" section from ``finish_with_heldout``'s result."""
    heldout = metrics.get("heldout")
    if heldout is None:
        return "Not measured by this run (no held-out prompts beside the target and no `eval_prompts` given)."
    rows = {k: v for k, v in heldout.items() if k.startswith("temperature")}
    return f"""Measured at the end of the run on the saved draft, loaded through the serving path
(`{heldout["spec"]}`, device {heldout["device"]}), on the {heldout["num_prompts"]} held-out prompts of
`{Path(heldout["prompts"]).name}`, {heldout["max_tokens"]} tokens each; at temperature 0 the output equals the
target's own for {100 * heldout["temperature 0"]["same_output_as_target"]:.0f}% of the prompts:

{acceptance_table(rows)}"""
