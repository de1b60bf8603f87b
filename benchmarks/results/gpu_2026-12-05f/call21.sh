#!/usr/bin/env bash
# Device call 21 (rewritten 2026-12-05, seventeenth session, before it ran): MTP drafting past its layers (the last
# layer goes on, 865d49e; bench e2e's MTP now drafts up to 4 steps on
# the 2-layer DeepSeek and Qwen3.5, 5 on the 3-layer Llama, adaptive). bench e2e at batch 1 (calls 16/20: DeepSeek
# MTP 1.90x steady, 1.72x closed; Qwen3.5 2.31x, 2.16x), then the Llama shape at batch 1 if time is left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_deepseek --workdir /tmp/e2e_deepseek > $OUT/e2e_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_deepseek.log
timeout 200 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_qwen35 --workdir /tmp/e2e_qwen35 > $OUT/e2e_qwen35.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_qwen35.log
timeout $(( 590 - SECONDS )) python3 -m outpace bench e2e --family llama --batch-sizes 1 --methods none eagle3 mtp \
  --out $OUT/e2e_llama --workdir /tmp/e2e_llama > $OUT/e2e_llama.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_llama.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for family in deepseek qwen35 llama; do grep -E -A10 "^method|rc=" $OUT/e2e_$family.log | tail -n 12; done
