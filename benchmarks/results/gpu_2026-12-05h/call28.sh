#!/usr/bin/env bash
# Device call 28: the widened DeepSeek at batch 1, plain against MTP (up to 4 steps), with the profile
# over idle rows (each its own token, so a verify's rows route apart). In gpu_2026-12-05g call 21 (the padding
# row's profile) MTP took 4 drafts in 70 of 123 verifies, though the measured costs (chain 3: 3.93 ms, chain 4:
# 5.21) favoured 3: 2.50x plain decoding, closed batch 2.18x.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 220 python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_deepseek --workdir /tmp/e2e_deepseek > $OUT/e2e_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_deepseek.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E -A8 "^method|rc=" $OUT/e2e_deepseek.log | tail -n 10
