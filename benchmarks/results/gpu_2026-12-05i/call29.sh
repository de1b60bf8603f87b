#!/usr/bin/env bash
# Device call 29: gpu_2026-12-05h's call 28 (the widened DeepSeek at batch 1, plain against MTP, profiled over
# idle rows), then Qwen3.5's EAGLE3 at batch 32 (issue 43 item 7: 0.99x steady, 0.97x closed at temperature 0.8
# in gpu_2026-12-05h call 27): the `none` rows' profiled_step_ms (plain decoding's step) beside the EAGLE3 rows'
# chooser.profiled_step_ms["none"] (its held step) says what holding costs over plain decoding.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 220 python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_deepseek --workdir /tmp/e2e_deepseek > $OUT/e2e_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_deepseek.log
rm -rf /tmp/e2e_deepseek
timeout 200 python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 --methods none eagle3 \
  --out $OUT/e2e_qwen35 --workdir /tmp/e2e_qwen35 > $OUT/e2e_qwen35.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_qwen35.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for family in deepseek qwen35; do grep -E -A8 "^method|rc=" $OUT/e2e_$family.log | tail -n 10; done
python3 - <<'PY'
import glob, json, os
for path in sorted(glob.glob(os.environ["OUT"] + "/e2e_*/*.json")):
    for r in json.load(open(path))["rows"]:
        c = r.get("chooser") or {}
        print(r["method"], r["batch"], r["temperature"], "plain profiled", r.get("profiled_step_ms"),
              "| step_ms", c.get("step_ms"), "| profiled", c.get("profiled_step_ms"), "| by drafts", r.get("verifies_by_num_drafts"))
PY
