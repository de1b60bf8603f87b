#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-05c: the settings sweep on Qwen3.5-35B-A3B's decode step, and the Mistral Small 4
# slice benched (bf16, batch 1 / 8 / 32 against the floor).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 benchmarks/scripts/decode_settings.py $OUT/a3b_qwen35.json a3b_qwen35 > $OUT/settings.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
timeout 180 python3 -m outpace.bench.families --out $OUT/bench --no-verify --shapes mistral-small-4-slice \
  > $OUT/bench.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/bench.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -v Warning $OUT/settings.log | tail -n 13
grep -v Warning $OUT/bench.log | tail -n 12
