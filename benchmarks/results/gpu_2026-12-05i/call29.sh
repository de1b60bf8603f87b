#!/usr/bin/env bash
# Device call 29: Qwen3.5's EAGLE3 at batch 32 (issue 43 item 7: 0.99x steady, 0.97x closed at temperature 0.8
# in gpu_2026-12-05h call 27), before (.snap_a: the package at bcae089, EAGLE3's held step running fc) and after
# (this commit: the pending windows keep the aux states, fc runs in the draft-extend; a held row's append is one
# launch). The `none` rows'
# profiled_step_ms (plain decoding's step) beside the EAGLE3 rows' chooser.profiled_step_ms["none"] (its held
# step) says what holding costs over plain decoding. Then gpu_2026-12-05h's call 28 in the time left: the widened
# DeepSeek at batch 1, plain against MTP, profiled over idle rows.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# the held rows' append kernel against the torch form; held and narrow EAGLE3 / MTP steps captured, lossless
PYTHONPATH=. timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 tests/speculative/test_pending_window.py \
  tests/speculative/test_zero_draft_hold.py tests/gpu/test_gpu.py -k "pending or hold or eagle3" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
tail -n 3 $OUT/pytest.log
PYTHONPATH=.snap_a timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 --methods none eagle3 \
  --out $OUT/e2e_qwen35_before --workdir /tmp/e2e_qwen35 > $OUT/e2e_qwen35_before.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_qwen35_before.log
mkdir -p $OUT/e2e_qwen35_after && cp $OUT/e2e_qwen35_before/*.json $OUT/e2e_qwen35_after/  # its none rows
PYTHONPATH=. timeout 150 python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 \
  --methods eagle3 --out $OUT/e2e_qwen35_after --workdir /tmp/e2e_qwen35 > $OUT/e2e_qwen35_after.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_qwen35_after.log
rm -rf /tmp/e2e_qwen35
PYTHONPATH=. timeout $(( 590 - SECONDS )) python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_deepseek --workdir /tmp/e2e_deepseek > $OUT/e2e_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_deepseek.log
rm -rf /tmp/e2e_deepseek
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for log in $OUT/e2e_*.log; do echo "== $log"; grep -E -A6 "^method|rc=" $log | tail -n 8; done
python3 - <<'PY'
import glob, json, os
for path in sorted(glob.glob(os.environ["OUT"] + "/e2e_*/*.json")):
    print(path.split("/")[-2])
    for r in json.load(open(path))["rows"]:
        c = r.get("chooser") or {}
        print(" ", r["method"], r["batch"], r["temperature"], "plain profiled", r.get("profiled_step_ms"),
              "| step_ms", c.get("step_ms"), "| profiled", c.get("profiled_step_ms"), "| by drafts", r.get("verifies_by_num_drafts"))
PY
gzip $OUT/e2e_*/*.json
