#!/usr/bin/env bash
# Device call 23 (for the next session with a device): the Llama-3.1-8B shape (widened zoo), which call 21 could not
# widen (its disk held the DeepSeek and Qwen3.5 work folders: "No space left on device"). bench e2e at batch 1 and 8,
# plain against EAGLE3, the standalone draft and MTP (now up to 5 steps over the zoo's 3 layers), with the drafters'
# prompt layers captured. benchmarks/results/e2e (H100, eager absorbs, MTP at 3 steps): at batch 1, T = 0, EAGLE3
# 2.68x steady / 2.56x closed, MTP 2.83x / 2.67x.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
rm -rf /tmp/e2e_deepseek /tmp/e2e_qwen35
nvidia-smi --query-gpu=name --format=csv,noheader
df -h /tmp | tail -n 1
timeout 580 python3 -m outpace bench e2e --family llama --batch-sizes 1 8 --methods none eagle3 draft mtp \
  --out $OUT/e2e_llama --workdir /tmp/e2e_llama > $OUT/e2e_llama.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_llama.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E -A20 "^method|rc=" $OUT/e2e_llama.log | tail -n 22
