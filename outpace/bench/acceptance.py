"""Acceptance of each drafter on the zoo's held-out prompts at temperature 0 (``outpace bench
acceptance``): tau, per-position acceptance rates and the histogram, as JSON and a plot; and how
far each drafter's output matches ``--method none`` (exactly, in fp32 on the CPU; on a GPU in
bf16 different kernel shapes for verify and decode can round differently and flip a near-tie).
Beside them, tau and per-position acceptance at temperature 1 (rejection sampling; the engine's seed
fixes the draws, and no output comparison applies)."""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.model_config import ModelConfig
from outpace.models.drafts.hybrid_mtp import mtp_layer_count
from outpace.speculative.metrics import SpecMetrics
from outpace.zoo import TARGET


def measure_acceptance(
    model: str,
    configs: dict[str, SpeculativeConfig],
    prompts: list[str],
    max_tokens: int,
    engine_kwargs: dict,
) -> dict[str, dict]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    reference = [o.token_ids for o in LLM(model, **engine_kwargs).generate(prompts, params)]
    results = {}
    for name, spec in tqdm(configs.items(), desc="acceptance"):
        llm = LLM(model, speculative=spec, **engine_kwargs)
        outs = llm.generate(prompts, params)
        metrics = SpecMetrics.total(o.spec_metrics for o in outs)
        at_one = SpecMetrics.total(o.spec_metrics for o in llm.generate(prompts, sampled))
        same_prefix = [_common_prefix(o.token_ids, ref) for o, ref in zip(outs, reference)]
        results[name] = {
            "method": spec.method,
            "num_steps": spec.num_steps,
            "topk": spec.topk,
            "num_draft_tokens": spec.num_draft_tokens,
            "lossless": [o.token_ids for o in outs] == reference,
            "prompt_match_rate": sum(n == len(r) for n, r in zip(same_prefix, reference))
            / len(reference),
            "token_match_rate": sum(same_prefix) / sum(len(r) for r in reference),
            **metrics.to_dict(),
            "temperature 1": {
                "acceptance_length": at_one.acceptance_length,
                "acceptance_rate_per_position": at_one.acceptance_rate_per_position,
                "num_verifies": at_one.num_verifies,
            },
        }
    return results


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Tokens before the first difference."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def plot_acceptance(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        rates = r["acceptance_rate_per_position"]
        ax.plot(
            range(1, len(rates) + 1),
            rates,
            marker="o",
            label=f"{name} (tau {r['acceptance_length']:.2f})",
        )
    ax.set(
        xlabel="draft position (depth)",
        ylabel="fraction of verifies accepting it",
        ylim=(0, 1),
        title="Acceptance per position, zoo held-out prompts, temperature 0",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def zoo_drafters(model: str, zoo: Path) -> dict[str, SpeculativeConfig]:
    """The drafters to measure on a zoo target: its zoo drafts (``zoo/<name>-eagle3``, ``-draft``, ``-dflash``
    where they exist), its MTP layers chained (when it has them) and n-gram."""
    name = Path(model).name
    eagle3, draft, dflash = (zoo / f"{name}-{kind}" for kind in ("eagle3", "draft", "dflash"))
    configs = {}
    if eagle3.is_dir():
        configs["eagle3 chain (5 steps)"] = SpeculativeConfig("eagle3", str(eagle3), num_steps=5)
        configs["eagle3 tree (topk 4, 16 tokens)"] = SpeculativeConfig(
            "eagle3", str(eagle3), num_steps=5, topk=4, num_draft_tokens=16
        )
    # num_nextn_predict_layers, or Qwen3.5's mtp_num_hidden_layers (models/drafts/hybrid_mtp.py)
    mtp_layers = mtp_layer_count(ModelConfig.from_pretrained(model).raw)
    if mtp_layers:
        configs[f"mtp chained ({mtp_layers} steps)"] = SpeculativeConfig(
            "mtp", num_steps=mtp_layers
        )
    if draft.is_dir():
        configs["standalone draft (5 steps)"] = SpeculativeConfig("draft", str(draft), num_steps=5)
    configs["ngram (5 steps)"] = SpeculativeConfig("ngram", num_steps=5)
    if dflash.is_dir():
        from outpace.models.drafts.dflash import dflash_block_size

        block = dflash_block_size(dflash)
        configs[f"dflash (block {block})"] = SpeculativeConfig(
            "dflash", str(dflash), num_steps=block - 1
        )
    return configs


def run_acceptance_bench(
    model: str, zoo: Path, out_dir: Path, max_tokens: int, engine_kwargs: dict
) -> dict:
    """Every zoo drafter of ``model`` (``zoo_drafters``); results in acceptance[_<model>][_gpu].json and .png
    (no model suffix for the zoo's default target)."""
    prompts = json.loads((zoo / "eval_prompts.json").read_text())["prompts"]
    configs = zoo_drafters(model, zoo)
    results = measure_acceptance(model, configs, prompts, max_tokens, engine_kwargs)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = ("" if Path(model).name == TARGET else f"_{Path(model).name}") + (
        "" if engine_kwargs.get("device", "cpu") == "cpu" else "_gpu"
    )
    (out_dir / f"acceptance{tag}.json").write_text(
        json.dumps(
            {
                "prompts": len(prompts),
                "max_tokens": max_tokens,
                "engine": engine_kwargs,
                "results": results,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    plot_acceptance(results, out_dir / f"acceptance{tag}.png")
    print(
        f"{'drafter':>34} {'tau':>6} {'tau T=1':>8} {'same output':>12} {'same tokens':>12}  "
        "per-position acceptance (T=0)"
    )
    for name, r in results.items():
        rates = " ".join(f"{x:.2f}" for x in r["acceptance_rate_per_position"])
        print(
            f"{name:>34} {r['acceptance_length']:>6.2f} {r['temperature 1']['acceptance_length']:>8.2f} "
            f"{r['prompt_match_rate']:>12.1%} {r['token_match_rate']:>12.1%}  {rates}"
        )
    return results
