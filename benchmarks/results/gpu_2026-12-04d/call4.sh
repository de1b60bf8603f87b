#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04d (nvidia-h200): is the one-row fp8 product bound by its conversions? The loop of
# row_times_tile with the weight's values loaded by the copy engine (TMA) (benchmarks/scripts/fp8_row_conversion.py).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 300 python3 benchmarks/scripts/fp8_row_conversion.py $OUT/fp8_row_conversion.json > $OUT/conv.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/conv.log
tar -czf $OUT/logs.tgz -C $OUT conv.log fp8_row_conversion.json
grep -v Warning $OUT/conv.log | tr '|' '\n' | tail -n 200
