#!/usr/bin/env bash
# Device call 24 (for the next session with a device, after call 23): issue 43 item 7 (every drafter at least plain
# decoding's speed at every batch and temperature, closed batches too) on the widened DeepSeek and Qwen3.5 at batch
# 8 and 32, with the prompt layers captured (2962f31) and MTP drafting up to 4 steps (865d49e). The last runs at
# batch 32 were older than both: Qwen3.5 EAGLE3 at temperature 0.8 0.93x-1.05x steady, 0.93x-1.00x closed (H200,
# gpu_2026-11-29d .. gpu_2026-11-30d); DeepSeek MTP at batch 8 1.68x steady, 1.41x closed (call 20, 2 steps).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
rm -rf /tmp/e2e_llama
nvidia-smi --query-gpu=name --format=csv,noheader
for family in deepseek qwen35; do
  timeout 290 python3 -m outpace bench e2e --family $family \
    --batch-sizes 8 32 --methods none eagle3 mtp --out $OUT/e2e_$family --workdir /tmp/e2e_$family \
    > $OUT/e2e_$family.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_$family.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for family in deepseek qwen35; do grep -E -A14 "^method|rc=" $OUT/e2e_$family.log | tail -n 16; done
