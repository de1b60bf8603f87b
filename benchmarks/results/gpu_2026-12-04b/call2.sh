#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04b (nvidia-h200): INT4 tiles (benchmarks/scripts/int4_tiles.py) for the grouped
# experts at 1, 8 and 32 tokens and the few-row product at 1, 8 and 16 rows, the PTX nibbles on.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 560 python3 benchmarks/scripts/int4_tiles.py $OUT/int4_tiles.json > $OUT/tiles.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tiles.log
tar -czf $OUT/logs.tgz -C $OUT tiles.log $(cd $OUT && ls int4_tiles.json 2>/dev/null)
grep -v Warn $OUT/tiles.log | tail -n 90
