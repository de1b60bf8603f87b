#!/usr/bin/env bash
# Qwen3.5's widened EAGLE3 tree against plain decoding in one closed batch of 32 at temperature 0.8 (64 tokens),
# its steps 0, 1, 2 (the prompts' prefill, the first drafting ones), 10 and 45 (drafting, held) under torch.profiler:
# where the tree's 31 ms more over the prompts' prefill go, and its steps' host time (gpu_2026-12-06e call 6).
# LIMIT: the run's seconds (470).
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${LIMIT:-470} python3 benchmarks/scripts/closed_batch_rounds.py --family qwen35 --methods eagle3-tree --batches 32 \
  --temperatures 0.8 --rounds 1 --max-tokens 64 --workdir /tmp/e2e_qwen35 --out $OUT/rounds.json \
  --steps $OUT/steps.json --profile-steps 0 1 2 10 45 > $OUT/profile.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/profile.log
sed -i -E 's/\r/\n/g' $OUT/profile.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/profile.log
grep -E "under torch|time total|^method|^eagle3|^none|rc=|Error" $OUT/profile.log
