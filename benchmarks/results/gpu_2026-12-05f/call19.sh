#!/usr/bin/env bash
# Device call 19 (written for the next session with a device): the MTP layers' absorb captured with the prefill
# forward (engine/prefill_graphs.py, after 580bde3). (1) On CUDA: the DeepSeek GPU tests (the captured absorb's
# own test among them, and the grouped-expert patches that failed in call 16 for a stale module name), the MoE
# families' and the zoo drafters' lossless and replay tests; (2) diag_spec_gaps on the widened DeepSeek: the
# prefill step's parts (call 18: absorb 18.4 ms of host time, the step 36.4 ms against 21.8 without MTP), now
# with the CUDA calls that took the host longest.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/gpu/test_gpu_deepseek.py \
  tests/gpu/test_gpu_moe_families.py tests/gpu/test_gpu.py -k "deepseek or moe or zoo_drafters or every_decode_step or prefill_chunks or absorb or hybrid_prefill" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout $(( 590 - SECONDS )) python3 benchmarks/scripts/diag_spec_gaps.py --family deepseek --methods none mtp \
  --max-tokens 64 --workdir /tmp/e2e_deepseek --out $OUT/gaps_deepseek.json > $OUT/gaps_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/gaps_deepseek.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
python3 - <<'PY'
import json, os
for row in json.load(open(os.environ["OUT"] + "/gaps_deepseek.json")):
    for phase, p in row["prefill_step"].items():
        print(row["method"], phase, p.get("wall_ms"), "ms", p.get("launches"), "launches",
              p.get("host_wait_ms"), "ms waiting", p.get("runtime_ms", [])[:3])
    print(row["method"], "edge steps", row["edge_steps_ms"], "median step", round(row["median_step_ms"], 3),
          "request", round(row["request_ms"], 1))
PY
tail -n 2 $OUT/gaps_deepseek.log
