"""benchmarks/train_ablation.py builds a valid recipe for every variant of every method at every size
(a DFlash size whose continuations held fewer anchor positions than it asked for failed only when its
turn came, minutes into a run)."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_ablation.py"
spec = importlib.util.spec_from_file_location("train_ablation", SCRIPT)
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)


@pytest.mark.parametrize("size", list(ablation.SIZES))
@pytest.mark.parametrize("method", list(ablation.VARIANTS))
def test_every_variant_builds_its_recipe(method, size):
    variants = ablation.VARIANTS[method]
    assert variants[0][0] in ("full", "as trained") and len({name for name, _, _ in variants}) == len(variants)
    for name, _, overrides in variants:
        if overrides is not None:  # None: the target's own layers, not trained
            recipe = ablation.recipe_for(method, ablation.SIZES[size], overrides)
            assert all(getattr(recipe, k) == v for k, v in overrides.items()), name
