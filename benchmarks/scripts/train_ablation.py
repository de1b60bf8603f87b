"""What each element of the draft recipes is worth in held-out tau on the zoo (issue 22 item 4).

For each method, the recipe as it is ("full") and variants with one element removed (or, where the
recipe leaves an element out, added) are trained for the same number of steps on the zoo target, and every
saved draft is measured through the serving path on the zoo's held-out prompts at temperature 0 and 1
(train/evaluate.py). Variants that share their data settings share one set of target continuations.
Writes OUT/train_ablation.json and OUT/train_ablation.md (one table per method); a variant whose
result is already in OUT is not run again, so a stopped run goes on where it stopped.

  python benchmarks/scripts/train_ablation.py OUT --size cpu            # CPU-sized (minutes): a smoke run only
  # (2026-11-27, 150 steps: every EAGLE3 variant reached held-out tau 1.22-1.26 at T=0, so this size does not
  # separate the recipe's elements; the table the issue asks for needs the GPU size)
  python benchmarks/scripts/train_ablation.py OUT --size gpu --device cuda --methods eagle3   # ~8 min on an H100
  python benchmarks/scripts/train_ablation.py OUT --merge OUT_A OUT_B ...  # one table of runs made side by side
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root
sys.path.insert(0, str(ROOT))

# method -> [(variant, what it changes, recipe overrides)]; "full" first. Elements the recipe uses are
# removed; elements it leaves out (DFlash's soft labels, a 0.8 depth decay for MTP) are added.
SAMPLED_DATA = dict(data_temperature=0.8, corpus_fraction=0.5)
GREEDY_ONLY = dict(corpus_fraction=0.0)
VARIANTS = {
    "eagle3": [
        (
            "full",
            "the recipe: TTT 7 steps, 0.8^j, soft labels, OOV rows out, greedy data + half corpus windows, "
            "whole vocabulary",
            {},
        ),
        ("no TTT", "ttt_steps 1 (step 0 only)", dict(ttt_steps=1)),
        ("uniform step weights", "step_decay 1.0", dict(step_decay=1.0)),
        ("hard labels", "CE against the target's argmax", dict(soft_labels=False)),
        ("no corpus windows", "greedy continuations only", GREEDY_ONLY),
        ("sampled data", "continuations at T=0.8, half corpus windows", SAMPLED_DATA),
        # the default capture [2, L/2, L-3] reads the inputs of layers 2, 3, 4 of the zoo's 6-layer target, so the
        # draft never sees its last two layers (DFlash reads layer 5's output)
        (
            "top-layer features",
            "aux_layer_ids [2, 4, 6] (inputs of layers 2 and 4, the last layer's output)",
            dict(aux_layer_ids=(2, 4, 6)),
        ),
        # the recipe's draft vocabulary is the zoo target's whole 4096 ids; the 2048 most frequent cover 94% of its
        # greedy tokens
        (
            "2048-token draft vocabulary",
            "draft_vocab_size 2048 (half the target's)",
            dict(draft_vocab_size=2048),
        ),
        # (with the whole vocabulary no row's argmax is out of it: compare this one with the 2048-token variant)
        (
            "2048 tokens, OOV rows kept",
            "draft_vocab_size 2048, mask_out_of_vocab off",
            dict(draft_vocab_size=2048, mask_out_of_vocab=False),
        ),
    ],
    "dflash": [
        (
            "full",
            "the recipe: block 8, 5 layers, 64 anchors in the continuation, gamma 4, hard labels, data at T=0.4 "
            "+ half corpus windows",
            {},
        ),
        ("uniform row weights", "loss_gamma 1e6", dict(loss_gamma=1e6)),
        ("8 anchors", "num_anchors 8", dict(num_anchors=8)),
        ("+ soft labels", "soft_label_weight 1.0 (added)", dict(soft_label_weight=1.0)),
        ("no corpus windows", "continuations at T=0.4 only", dict(corpus_fraction=0.0)),
        (
            "greedy data",
            "greedy continuations (T=0), half corpus windows",
            dict(data_temperature=0.0),
        ),
        (
            "data at T=0.8",
            "continuations at T=0.8, half corpus windows",
            dict(data_temperature=0.8),
        ),
    ],
    "mtp": [
        ("as trained", "the zoo target's MTP layers, not fine-tuned", None),
        (
            "full",
            "the recipe: chained, soft labels, mean over depths, greedy data + half corpus windows",
            {},
        ),
        ("hard labels", "CE against the target's argmax", dict(soft_labels=False)),
        ("+ 0.8 depth decay", "depth_decay 0.8 (added)", dict(depth_decay=0.8)),
        ("no corpus windows", "greedy continuations only", GREEDY_ONLY),
        ("sampled data", "continuations at T=0.8, half corpus windows", SAMPLED_DATA),
    ],
}
# the short budget each variant trains for
SIZES = {
    "cpu": dict(
        num_continuations=256,
        prompt_len=32,
        new_tokens=64,
        batch_size=8,
        steps=150,
        warmup_steps=15,
        max_minutes=None,
        generation_batch=256,
        eval_max_tokens=48,
        eval_num_prompts=8,
        num_anchors=32,
    ),  # DFlash: at most new_tokens - block_size + 2 distinct anchors
    # a fixed step count, not a time budget: the methods run side by side on one GPU (gpu_run.sh ablation), and
    # under a time budget a variant's step count followed how busy the GPU was when its turn came (2026-11-27:
    # 207 to 541 steps in 30 s, benchmarks/results/train_ablation_gpu)
    # (eager: compiling a step takes about a minute, more than it saves over 500 steps)
    "gpu": dict(
        num_continuations=4096,
        steps=500,
        generation_batch=1024,
        max_minutes=None,
        compile_step=False,
    ),
}
DATA_FIELDS = (
    "num_continuations",
    "prompt_len",
    "new_tokens",
    "data_temperature",
    "corpus_fraction",
    "seed",
    "max_corpus_bytes",
    "prompt_files",
    "prompt_split",
    "eval_prompts",
)


def recipe_for(method: str, base: dict, overrides: dict):
    from outpace.cli.train import DRAFT_RECIPES
    from outpace.registry import resolve

    cls = resolve({method: DRAFT_RECIPES[method][0]}, method, "draft recipe")
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in {**base, **overrides}.items() if k in fields})


def shared_data(recipe, target: Path, cache_dir: Path, device: str) -> Path:
    """The continuations for this recipe's data settings, generated once into cache_dir."""
    import hashlib

    from outpace.train.distill import DistillData

    key = repr([getattr(recipe, f) for f in DATA_FIELDS])
    path = cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if not path.is_file():
        DistillData.for_recipe(target, recipe, device, cache=path)
    return path


def run_variant(
    method: str, recipe, target: Path, out: Path, data: Path | None, device: str
) -> dict:
    from outpace.config import SpeculativeConfig
    from outpace.train.evaluate import heldout_acceptance, heldout_prompts_file, load_prompts

    started = time.perf_counter()
    if recipe is None:  # the target's own MTP layers, measured as they are
        prompts = load_prompts(heldout_prompts_file(target, None))[: SIZES_USED["eval_num_prompts"]]
        heldout = heldout_acceptance(
            target,
            SpeculativeConfig("mtp", num_steps=3),
            prompts,
            SIZES_USED["eval_max_tokens"],
            device,
        )
        return dict(
            heldout=heldout,
            train_wall_seconds=0.0,
            final_loss=None,
            steps=0,
            wall_seconds=time.perf_counter() - started,
        )
    from outpace.cli.train import DRAFT_RECIPES
    from outpace.registry import resolve

    train_fn = resolve({method: DRAFT_RECIPES[method][1]}, method, "draft recipe")
    shutil.rmtree(out, ignore_errors=True)
    (out / "resume").mkdir(parents=True)
    shutil.copy(data, out / "resume" / "data.pt")  # the run reads its continuations from here
    m = train_fn(target, recipe, out, device)
    return dict(
        heldout={k: v for k, v in m["heldout"].items() if k.startswith("temperature")},
        train_wall_seconds=m["train_wall_seconds"],
        final_loss=m["final_loss"],
        steps=m["history"]["total_steps"],
        wall_seconds=time.perf_counter() - started,
    )


SIZES_USED: dict = {}


def markdown(results: dict, args) -> str:
    lines = [
        f"# Draft recipe ablation on the zoo ({args.size}-sized budget, device {args.device})",
        "",
        f"Command: `python benchmarks/scripts/train_ablation.py {args.out} {' '.join(sys.argv[2:])}`",
        "",
        "Held-out tau (committed tokens per verify) on the zoo's held-out prompts through the serving path; "
        "each variant changes one element of the recipe; `steps` and `train s` say how long each trained.",
        "",
    ]
    for method, rows in results.items():
        lines += [
            f"## {method}",
            "",
            "| variant | change | tau T=0 | tau T=1 | final loss | steps | train s |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in rows.items():
            h = r["heldout"]
            loss = "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}"
            lines.append(
                f"| {name} | {r['change']} | {h['temperature 0']['acceptance_length']:.2f} | "
                f"{h['temperature 1']['acceptance_length']:.2f} | {loss} | {r['steps']} | "
                f"{r['train_wall_seconds']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def merge_runs(out: Path, run_dirs: list[Path], args) -> None:
    """OUT/train_ablation.json and .md holding every method of ``run_dirs`` (each a run of this script);
    the runs must share their size, device and base recipe fields."""
    runs = [json.loads((d / "train_ablation.json").read_text()) for d in run_dirs]
    shared = {k: runs[0][k] for k in ("size", "device", "base", "target")}
    for d, r in zip(run_dirs, runs):
        if {k: r[k] for k in shared} != shared:
            raise ValueError(
                f"{d}: its size, device, base fields or target differ from {run_dirs[0]}'s"
            )
    results = {m: rows for r in runs for m, rows in r["results"].items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_ablation.json").write_text(
        json.dumps(
            {**shared, "merged_from": [str(d) for d in run_dirs], "results": results}, indent=2
        )
        + "\n"
    )
    args.size, args.device = shared["size"], shared["device"]
    (out / "train_ablation.md").write_text(markdown(results, args))
    print((out / "train_ablation.md").read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--methods", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--target", default=str(ROOT / "zoo" / "tinypy"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", default="cpu", choices=list(SIZES))
    p.add_argument(
        "--minutes", type=float, default=None, help="training budget per variant (max_minutes)"
    )
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="write OUT's JSON and table from these runs' results (one method each, run side by side)",
    )
    args = p.parse_args(argv)
    if args.merge:
        return merge_runs(Path(args.out), [Path(d) for d in args.merge], args)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    base = dict(SIZES[args.size])
    if args.minutes is not None:
        base["max_minutes"] = args.minutes
    if args.steps is not None:
        base["steps"] = args.steps
    base.setdefault("eval_num_prompts", None)
    base.setdefault("eval_max_tokens", 64)
    SIZES_USED.update(base)
    out, target = Path(args.out), Path(args.target)
    out.mkdir(parents=True, exist_ok=True)
    result_file = out / "train_ablation.json"
    results = json.loads(result_file.read_text())["results"] if result_file.is_file() else {}
    for method in args.methods:
        for name, change, overrides in VARIANTS[method]:
            if name in results.get(method, {}):
                continue
            recipe = None if overrides is None else recipe_for(method, base, overrides)
            data = (
                None if recipe is None else shared_data(recipe, target, out / "data", args.device)
            )
            print(f"== {method}: {name} ({change})", flush=True)
            row = run_variant(
                method, recipe, target, out / method / name.replace(" ", "_"), data, args.device
            )
            row.update(change=change, overrides=overrides)
            results.setdefault(method, {})[name] = row
            result_file.write_text(
                json.dumps(
                    {
                        "size": args.size,
                        "device": args.device,
                        "base": base,
                        "target": str(target),
                        "results": results,
                    },
                    indent=2,
                )
                + "\n"
            )
            (out / "train_ablation.md").write_text(markdown(results, args))
    print((out / "train_ablation.md").read_text())


if __name__ == "__main__":
    main()
