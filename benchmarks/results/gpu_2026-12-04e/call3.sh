#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-04e (nvidia-h200): the wide one-row fp8 tiles (quant_matmul_kernel.one_row_wide_tiles,
# off) against the shipped ones inside V2-Lite's and the Step-3.5 slice's decode steps, block FP8 (call 2: the
# Qwen3-Next slice's step 0.670 -> 0.646 ms with them).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
for sweep in one_row_wide_v2_fp8 one_row_wide_step_fp8; do
  timeout $(( 290 * (1 + (SECONDS > 100)) - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/$sweep.json $sweep \
    > $OUT/$sweep.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
for f in $OUT/one_row_wide_*.log; do grep -v Warn $f | tail -n 4; done
