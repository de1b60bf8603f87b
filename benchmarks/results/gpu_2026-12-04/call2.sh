#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04 (nvidia-h200), from the checkout: (1) one_row_products.py, fixed (call 1 stopped
# at Gemma 4's FP8 stacks, whose 704 rows are no whole scale blocks) with fewer settings and each kernel's share;
# (2) decode_settings.py one_row_v2_fp8, one_row_v2, one_row_gemma4, one_row_qwen3next_fp8: the one-row paths on
# and off in the decode step (call 1's sweep had batch 1 alone, whose KV cache was too small for the timed steps).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 150 python3 benchmarks/scripts/one_row_products.py $OUT/one_row.json > $OUT/one_row.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/one_row.log
for sweep in one_row_v2_fp8 one_row_v2 one_row_gemma4 one_row_qwen3next_fp8; do
  left=$(( 585 - SECONDS ))
  [ $left -gt 30 ] || break
  timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/$sweep.json $sweep > $OUT/$sweep.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json)
grep -v Warning $OUT/one_row.log | grep -E "floor|rc=|wrong|Error|16-row tiles:|\(\(" | tail -n 40
for f in $OUT/one_row_*.log; do grep -v Warning $f | tail -n 7; done
