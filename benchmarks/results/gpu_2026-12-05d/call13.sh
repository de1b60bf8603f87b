#!/usr/bin/env bash
# Device call 13 (written for the next session with a device): longer K steps for the grouped experts' few-token
# tiles on the A3B shapes and DeepSeek-V2-Lite, in one process (decode_settings.py builds each shape once).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/scripts/decode_settings.py $OUT/sweeps expert_k_steps_qwen3 expert_k_steps_qwen35 \
  expert_k_steps_v2 > $OUT/settings.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -vE " b[0-9]+@|Warning|warn" $OUT/settings.log | tail -n 30
