"""How fast each draft recipe trains, eager against compiled (``compile_step``), on the zoo target.

Each (method, batch, compile) runs the recipe for ``--steps`` steps on a small set of continuations (the
data's size does not change a step's cost) and reports the steady training rate: the median tokens/s of the
log intervals in the run's second half (``TrainHistory.tokens_per_second``), and how long the first step
took (compilation included), from the run's wall time and that rate.

    PYTHONPATH=. python benchmarks/scripts/diag_train_step.py --out DIR --device cuda \
        --runs eagle3:128:eager eagle3:128:compiled dflash:128:eager dflash:128:compiled
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from outpace.cli.train import DRAFT_RECIPES
from outpace.registry import resolve


def steady_rate(history: dict) -> float:
    rates = history["tokens_per_second"]
    return statistics.median(rates[len(rates) // 2 :])


def run(method: str, batch: int, compile_step: bool, steps: int, device: str, out: Path) -> dict:
    recipe_cls = resolve({method: DRAFT_RECIPES[method][0]}, method, "draft recipe")
    train_fn = resolve({method: DRAFT_RECIPES[method][1]}, method, "draft recipe")
    recipe = recipe_cls(
        batch_size=batch,
        steps=steps,
        max_minutes=None,
        compile_step=compile_step,
        num_continuations=256,
        generation_batch=256,
        eval_num_prompts=2,
        eval_max_tokens=16,
    )
    started = time.perf_counter()
    metrics = train_fn(
        Path("zoo/tinypy"),
        recipe,
        out / f"{method}_b{batch}_{'compiled' if compile_step else 'eager'}",
        device,
    )
    history = metrics["history"]
    rate = steady_rate(history)
    tokens_per_step = history["tokens_seen"] / steps
    return dict(
        method=method,
        batch=batch,
        compiled=compile_step,
        steps=steps,
        tokens_per_second=rate,
        ms_per_step=1000 * tokens_per_step / rate,
        train_wall_seconds=history["wall_seconds"],
        overhead_seconds=history["wall_seconds"] - steps * tokens_per_step / rate,
        run_wall_seconds=time.perf_counter() - started,
        final_loss=history["losses"][-1],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--runs", nargs="+", required=True, metavar="METHOD:BATCH:eager|compiled")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in a.runs:
        method, batch, mode = spec.split(":")
        if mode not in ("eager", "compiled"):
            raise SystemExit(f"run {spec!r}: the mode must be 'eager' or 'compiled'")
        rows.append(run(method, int(batch), mode == "compiled", a.steps, a.device, out / "runs"))
        (out / "train_step_speed.json").write_text(json.dumps(rows, indent=2))
    print(
        f"{'method':8} {'batch':>5} {'mode':9} {'tok/s':>10} {'ms/step':>8} {'1st-step s':>10} {'loss':>7}"
    )
    for r in rows:
        print(
            f"{r['method']:8} {r['batch']:5d} {'compiled' if r['compiled'] else 'eager':9} "
            f"{r['tokens_per_second']:10,.0f} {r['ms_per_step']:8.1f} {r['overhead_seconds']:10.1f} "
            f"{r['final_loss']:7.3f}"
        )


if __name__ == "__main__":
    main()
