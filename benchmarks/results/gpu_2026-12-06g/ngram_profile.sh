#!/usr/bin/env bash
# n-gram against plain decoding on the widened Llama at temperature 0.8, closed batches of 8 and 32 (64 tokens): steps
# 0 (the prompts' prefill), 1 (the first probe) and 20 (a flush step) under torch.profiler, to find the 0.67 / 1.72 ms
# more of n-gram's first step (gpu_2026-12-06g call 5) and to set its flush step beside plain decoding's.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${LIMIT:-400} python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 \
  --temperatures 0.8 --rounds 1 --max-tokens 64 --workdir /tmp/e2e_llama --out $OUT/ngram_profile.json \
  --steps $OUT/ngram_profile_steps.json --profile-steps 0 1 20 > $OUT/ngram_profile.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/ngram_profile.log
sed -i -E 's/\r/\n/g' $OUT/ngram_profile.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/ngram_profile.log
grep -E "under torch|time total|^method|^ngram|^none|rc=|Error" $OUT/ngram_profile.log
