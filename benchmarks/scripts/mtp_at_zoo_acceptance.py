"""A shape's MTP speed-up at the widened zoo's measured acceptance: the step costs by draft count that
``bench.families`` measured for the shape's MTP layer (its ``mtp_oracle`` rows: random weights, so their own
drafts accept nothing) against the acceptance that ``bench e2e --family`` measured for the widened zoo's MTP
drafter, which computes what the trained zoo model computes. Two measurements combined, labelled so; nothing is
run here.

Two readings of the e2e row (method mtp, batch 1, each temperature): the chooser's acceptance by depth at the
row's end (speculative/adaptive.py, decayed: the last hundred or so verifies), with which the best draft count
within those depths is taken (bench/oracle.py ``rows_at_rates``); and the row's mean tokens a verify (tau) at
the draft count its verifies mostly used.

    PYTHONPATH=. python3 benchmarks/scripts/mtp_at_zoo_acceptance.py MTP_ORACLE_JSON E2E_JSON [OUT.json]

(MTP_ORACLE_JSON: ``run_mtp_oracle``'s result, e.g. benchmarks/results/gpu_2026-12-01b/call1/mtp_oracle.json, or
a families.json whose shape has one, as ``python -m outpace.bench.families --quantized fp8 --shapes qwen3-next-80b``
writes it; E2E_JSON: e.g. benchmarks/results/gpu_2026-12-01g/call3/e2e_bench_qwen35.json.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from outpace.bench.oracle import rows_at_rates

LABEL = "step costs measured (bench.families mtp_oracle); acceptance measured on the widened zoo (bench e2e)"


def zoo_acceptance(e2e: dict) -> dict[float, dict]:
    """Per temperature, the e2e MTP row at batch 1: its chooser's rates by depth (the chain's, deepest key),
    its tau and the draft count most of its verifies used."""
    found = {}
    for row in e2e["rows"]:
        if row["method"] != "mtp" or row["batch"] != 1:
            continue
        chains = row["chooser"]["acceptance"]
        rates = max(chains.values(), key=len)
        by_drafts = row["verifies_by_num_drafts"]
        found[row["temperature"]] = {
            "rates": rates,
            "tau": row["tau"],
            "drafts": max(range(len(by_drafts)), key=by_drafts.__getitem__),
        }
    if not found:
        raise ValueError("the e2e JSON has no mtp row at batch 1")
    return found


def mtp_step_rows(report: dict) -> list[dict]:
    """The ``mtp_oracle`` rows of ``run_mtp_oracle``'s result, or of the one shape of a families.json that has
    them."""
    if "rows" in report:
        return report["rows"]
    found = [s["mtp_oracle"]["rows"] for s in report["shapes"].values() if "mtp_oracle" in s]
    if len(found) != 1:
        raise ValueError(
            f"{len(found)} shapes with MTP step costs in the report: name one file of one"
        )
    return found[0]


def main(oracle_path: str, e2e_path: str, out: str | None = None) -> None:
    report, e2e = (json.loads(Path(p).read_text()) for p in (oracle_path, e2e_path))
    rows = []
    for temperature, zoo in zoo_acceptance(e2e).items():
        for step in mtp_step_rows(report):
            costs = {int(k): ms / 1e3 for k, ms in step["step_ms"].items()}
            batch, k = step["batch"], zoo["drafts"]
            rows.append(
                {
                    "batch": batch,
                    "temperature": temperature,
                    "at_rates": rows_at_rates(costs, batch, zoo["rates"]),
                    "at_tau": {
                        "tau": zoo["tau"],
                        "num_drafts": k,
                        "speedup": zoo["tau"] * costs[0] / costs[k],
                    },
                }
            )
            r = rows[-1]
            print(
                f"batch {batch:>2} temperature {temperature}: rates {[round(a, 3) for a in zoo['rates']]} -> "
                f"{r['at_rates']['num_drafts']} drafts, {r['at_rates']['speedup']:.3f}x; tau {zoo['tau']:.3f} at "
                f"{k} drafts -> {r['at_tau']['speedup']:.3f}x"
            )
    if out:
        Path(out).write_text(
            json.dumps(
                {"label": LABEL, "oracle": oracle_path, "e2e": e2e_path, "rows": rows},
                separators=(",", ":"),
            )
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
