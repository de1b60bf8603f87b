#!/usr/bin/env bash
# Device call 21 (after calls 19 and 20): the captured absorb on the Llama-3.1-8B shape (widened zoo). bench e2e
# at batch 1 and 8 with 128 tokens, plain decoding against EAGLE3, the standalone draft and MTP, whose absorbs
# are now captured. benchmarks/results/e2e (H100, eager absorbs) measured what a request cost beyond its steady
# steps at batch 1: plain 5 ms, EAGLE3 14 ms, MTP 15.5 ms, the draft 29 ms. Its closed-batch ratios at batch 1,
# T = 0: EAGLE3 2.56x (steady 2.68x), MTP 2.67x (2.83x).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 580 python3 -m outpace bench e2e --family llama --batch-sizes 1 8 --methods none eagle3 draft mtp \
  --out $OUT/e2e_llama --workdir /tmp/e2e_llama > $OUT/e2e_llama.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_llama.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E -A20 "^method|rc=" $OUT/e2e_llama.log | tail -n 22
