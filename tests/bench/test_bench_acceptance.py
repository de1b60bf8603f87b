"""``outpace bench acceptance`` reports each drafter at temperature 0 (with the check against the target's
own output) and at temperature 1 (tau only: sampled outputs differ draw by draw)."""

from pathlib import Path

from outpace.bench.acceptance import measure_acceptance
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def test_both_temperatures_are_measured_and_greedy_output_is_checked():
    prompts = ["def add(a, b):\n    return", "import os\nimport sys\n\n\ndef main("]
    configs = {
        "eagle3": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=3),
        "ngram": SpeculativeConfig("ngram", num_steps=3),
    }
    results = measure_acceptance(str(ZOO / "tinypy"), configs, prompts, 16, dict(device="cpu"))
    for name, r in results.items():
        assert r["lossless"] and r["token_match_rate"] == 1.0, name
        assert 1.0 <= r["acceptance_length"] <= 4.0 and len(r["acceptance_rate_per_position"]) == 3
        at_one = r["temperature 1"]
        assert at_one["num_verifies"] > 0 and 1.0 <= at_one["acceptance_length"] <= 4.0
        assert len(at_one["acceptance_rate_per_position"]) == 3
    assert (
        results["eagle3"]["temperature 1"]["acceptance_length"] > 1.0
    )  # a trained draft is accepted sometimes
