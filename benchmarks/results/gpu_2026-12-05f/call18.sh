#!/usr/bin/env bash
# Device call 18: what the widened DeepSeek's MTP prefill step does. Call 17 (gpu_2026-12-05e) found the
# prefill step at 37.5 ms with MTP against 19.8 ms without: the ~19 ms a request that MTP's closed batches lose.
# diag_spec_gaps.py now splits the prefill step into the target's forward, the first tokens' sampling and the
# drafter's absorb, each with its wall time, kernel launches, host waits and most frequent torch ops.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 280 python3 benchmarks/scripts/diag_spec_gaps.py --family deepseek --methods none mtp --max-tokens 64 \
  --workdir /tmp/e2e_deepseek --out $OUT/gaps_deepseek.json > $OUT/gaps_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/gaps_deepseek.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
python3 - <<'PY'
import json, os
for row in json.load(open(os.environ["OUT"] + "/gaps_deepseek.json")):
    for phase, p in row["prefill_step"].items():
        print(row["method"], phase, p.get("wall_ms"), "ms", p.get("launches"), "launches",
              p.get("host_wait_ms"), "ms waiting", p.get("top_ops", [])[:4])
    print(row["method"], "edge steps", row["edge_steps_ms"], "median step", round(row["median_step_ms"], 3))
PY
tail -n 3 $OUT/gaps_deepseek.log
