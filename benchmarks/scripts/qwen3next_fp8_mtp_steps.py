"""The whole Qwen3-Next-80B-A3B in block FP8 with its MTP layer (an H200: the model is 80 GB): step costs by draft
count at every batch (bench/families.py ``run_mtp_oracle``), optionally through a token map
(speculative/hot_vocab.py). Writes the result as JSON and prints a line a batch.

    PYTHONPATH=. python benchmarks/scripts/qwen3next_fp8_mtp_steps.py OUT.json [--token-map MAP.pt]
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from outpace.bench.families import bench_shapes, run_mtp_oracle


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--token-map", default=None, help="a token map (--speculative-token-map's file)")
    a = p.parse_args()
    shape = bench_shapes("fp8", ["qwen3-next-80b"])["qwen3-next-80b"]
    workdir = Path(tempfile.mkdtemp(prefix="fam_mtp"))
    try:
        result = run_mtp_oracle(shape.config, workdir, a.token_map)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    Path(a.out).write_text(json.dumps(result))
    label = a.token_map or "no map"
    for row in result["rows"]:
        steps = {k: round(v, 3) for k, v in row["step_ms"].items()}
        print(f"{label}: batch {row['batch']}, step ms by drafts {steps}")


if __name__ == "__main__":
    main()
