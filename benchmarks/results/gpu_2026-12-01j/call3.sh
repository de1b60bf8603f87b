#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01j (nvidia-h200), from .snap/: the fused few-row kernels past 16 rows with every
# row in one program's tile (up to 64: fused_projection._row_tile), FEW_ROWS 16 / 32 / 64, on the 8B shape's
# captured decode step at 8 to 64 rows; each limit's logits against 16's over the same cache blocks.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 500 python3 benchmarks/scripts/fused_row_limit.py --limits 16 32 64 --batches 8 16 24 32 40 48 64 \
  > $OUT/logs/limit.log 2>&1
echo "rc=$?" >> $OUT/logs/limit.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
grep -vE "it/s|s/it" $OUT/logs/limit.log | tail -n 40
