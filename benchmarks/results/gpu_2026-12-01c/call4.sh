#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01c (nvidia-h200, one GPU), from .snap/ (the code of call 3): bench families on
# the shapes call 3 left (DeepSeek-V2-Lite, Gemma 4, Qwen3.5, DeepSeek-V3 slice): b1 / 8 / 32, kernels a step.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
cd .snap; export PYTHONPATH=.
timeout 420 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 400 \
  --shapes deepseek-v2-lite,gemma-4-26b-a4b,qwen3.5,deepseek-v3-slice > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
cd $OUT && tar czf logs.tgz logs
grep -v "%|" logs/fam.log | tail -n 22
rm -rf logs
