#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-05c: bench families after the gate/up few-token tiles' change (K step 256, 3 stages).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 -m outpace.bench.families --out $OUT/bench --no-verify --shapes qwen3-30b-a3b,deepseek-v2-lite \
  > $OUT/bench.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/bench.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -v Warning $OUT/bench.log | tail -n 12
