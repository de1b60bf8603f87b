#!/usr/bin/env bash
# Device call 27: gpu_2026-12-05g/call24.sh (issue 43 item 7: the widened DeepSeek and Qwen3.5 at batch 8 and 32,
# plain against EAGLE3 and MTP, closed batches too) with this session's profile over idle rows: the JSON's
# profiled_step_ms beside step_ms says how near the chooser's start-up costs came to the measured ones.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
rm -rf /tmp/e2e_llama
nvidia-smi --query-gpu=name --format=csv,noheader
for family in deepseek qwen35; do
  timeout 285 python3 -m outpace bench e2e --family $family \
    --batch-sizes 8 32 --methods none eagle3 mtp --out $OUT/e2e_$family --workdir /tmp/e2e_$family \
    > $OUT/e2e_$family.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_$family.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for family in deepseek qwen35; do grep -E -A14 "^method|rc=" $OUT/e2e_$family.log | tail -n 16; done
