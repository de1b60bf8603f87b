#!/usr/bin/env bash
# On an H200: the Kimi-K2 slice's batch-invariant cost (issue 43 item 8's one shape not measured: its 384 experts a
# layer did not fit an H100), then first_steps_ab.sh (the host repeats' change in closed batches) with the time left.
# Under 570 s.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/scripts/batch_invariant_speed.py --shapes kimi-k2-slice --contexts 512 \
  --out $OUT/kimi_invariant.json > $OUT/kimi_invariant.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/kimi_invariant.log
sed -i -E 's/\r/\n/g' $OUT/kimi_invariant.log
grep -vE '(it/s|s/it|tensor/s)\]$' $OUT/kimi_invariant.log | tail -12
unset PYTHONPATH
EACH=$(( (560 - SECONDS) / 2 )) bash benchmarks/results/gpu_2026-12-06h/first_steps_ab.sh
