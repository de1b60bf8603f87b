"""One replica's `outpace serve` (engine in-process, and with --engine-process) at 64 streams, plain decoding and
adaptive EAGLE3, on one GPU: bench/dp_serve.py ``dp_throughput`` with one replica, on the zoo widened to 8B
(the single-server figures of `bench multi`'s dp parts, without the two-replica server).

    PYTHONPATH=. python3 benchmarks/scripts/one_replica_server.py OUT_DIR     # (server wheels: benchmarks/scripts/gpu_run.sh)

Writes OUT_DIR/one_replica_64.json and prints output tokens/s and the EAGLE3 / plain ratios.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from outpace.bench.dp_serve import dp_throughput  # noqa: E402
from outpace.bench.multi_gpu_plan import Plan, widened_zoo  # noqa: E402


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan = Plan(world=1, dp_saturated_streams=None)
    target, draft = widened_zoo(plan, Path(".e2e_models"))
    rows = {}
    for name, drafter in (
        ("plain", ("--method", "none")),
        ("eagle3", ("--method", "eagle3", "--draft", draft)),
    ):
        start = time.time()
        rows[name] = dp_throughput(plan, target, drafter, replicas=1)
        rows[name]["seconds"] = time.time() - start
        (out / "one_replica_64.json").write_text(json.dumps(rows, indent=1))
        for server in ("one_replica", "one_replica_own_process"):
            print(name, server, round(rows[name][server]["output_tokens_per_s"]), flush=True)
    for server in ("one_replica", "one_replica_own_process"):
        ratio = (
            rows["eagle3"][server]["output_tokens_per_s"]
            / rows["plain"][server]["output_tokens_per_s"]
        )
        print(f"eagle3 / plain, {server}: {ratio:.2f}x")


if __name__ == "__main__":  # (the load's client processes import this module)
    main(Path(sys.argv[1]))
