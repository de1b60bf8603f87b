#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-04c (nvidia-h200): benchmarks/scripts/pair_order.py after pairs apart took the layout.s intermediate row spacing (row 16 b, not b): the grouped block-FP8 experts at
# one and two tokens, pairs apart or in the layout, over gate and up stacks of their own or packed into one.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 200 python3 benchmarks/scripts/pair_order.py $OUT/pair_order.json > $OUT/pair_order.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pair_order.log
grep -v Warn $OUT/pair_order.log | tail -n 26
