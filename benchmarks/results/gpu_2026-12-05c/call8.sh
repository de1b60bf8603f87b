#!/usr/bin/env bash
# Device call 8 of gpu_2026-12-05c (written for a session with a device): the A3B shapes and the Mistral Small 4 slice benched again (plain decode at
# batch 1, 8, 32 against the floor) on an H200, to compare with gpu_2026-12-05b after call 3's gate/up tiles.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 -m outpace.bench.families --out $OUT --no-verify \
  --shapes qwen3-30b-a3b,qwen3.5-35b-a3b,mistral-small-4-slice > $OUT/families.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/families.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tail -n 30 $OUT/families.log
