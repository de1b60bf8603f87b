"""benchmarks/scripts/train_ablation.py builds a valid recipe for every variant of every method at every size
(a DFlash size whose continuations held fewer anchor positions than it asked for failed only when its
turn came, minutes into a run)."""

from pathlib import Path

import pytest

from helpers.bench_scripts import load_bench_script

ablation = load_bench_script("train_ablation")


@pytest.mark.parametrize("size", list(ablation.SIZES))
@pytest.mark.parametrize("method", list(ablation.VARIANTS))
def test_every_variant_builds_its_recipe(method, size):
    variants = ablation.VARIANTS[method]
    assert variants[0][0] in ("full", "as trained") and len(
        {name for name, _, _ in variants}
    ) == len(variants)
    for name, _, overrides in variants:
        if overrides is not None:  # None: the target's own layers, not trained
            recipe = ablation.recipe_for(method, ablation.SIZES[size], overrides)
            assert all(getattr(recipe, k) == v for k, v in overrides.items()), name


def _fake_run(run_dir: Path, method: str, size: str = "gpu") -> None:
    import json

    heldout = {
        "temperature 0": {"acceptance_length": 2.5},
        "temperature 1": {"acceptance_length": 1.5},
    }
    row = dict(
        heldout=heldout,
        train_wall_seconds=30.0,
        final_loss=1.25,
        steps=900,
        change="the recipe",
        overrides={},
    )
    run_dir.mkdir(parents=True)
    (run_dir / "train_ablation.json").write_text(
        json.dumps(
            dict(
                size=size,
                device="cuda",
                base=ablation.SIZES[size],
                target="zoo/tinypy",
                results={method: {"full": row}},
            )
        )
    )


def test_merge_puts_side_by_side_runs_in_one_table_and_refuses_unlike_runs(tmp_path):
    import json

    _fake_run(tmp_path / "a", "eagle3")
    _fake_run(tmp_path / "b", "mtp")
    ablation.main([str(tmp_path / "out"), "--merge", str(tmp_path / "a"), str(tmp_path / "b")])
    merged = json.loads((tmp_path / "out" / "train_ablation.json").read_text())
    assert list(merged["results"]) == ["eagle3", "mtp"] and merged["size"] == "gpu"
    table = (tmp_path / "out" / "train_ablation.md").read_text()
    assert (
        "## eagle3" in table
        and "## mtp" in table
        and "| full | the recipe | 2.50 | 1.50 | 1.250 | 900 | 30 |" in table
    )
    _fake_run(tmp_path / "c", "dflash", size="cpu")
    with pytest.raises(ValueError, match="differ"):
        ablation.main([str(tmp_path / "out2"), "--merge", str(tmp_path / "a"), str(tmp_path / "c")])
