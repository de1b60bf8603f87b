#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01j (nvidia-h200), from .snap/: the fused few-row kernels past 16 rows with every
# row in one program's tile (up to 64: fused_projection._row_tile), FEW_ROWS 16 / 32 / 64, on the 8B shape's
# captured decode step at 8 to 64 rows; each limit's logits against 16's over the same cache blocks. Then n-gram's
# closed batches at temperature 0.8 with the chain probe one draft past the chain last chosen.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 240 python3 benchmarks/scripts/fused_row_limit.py --limits 16 32 64 --batches 8 16 24 32 40 48 64 \
  > $OUT/logs/limit.log 2>&1
echo "rc=$?" >> $OUT/logs/limit.log
timeout $(( 560 - SECONDS )) python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 \
  --temperatures 0.8 --rounds 5 --workdir /tmp/e2e --out $OUT/rounds.json --steps $OUT/steps.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -vE "it/s|s/it" $OUT/logs/limit.log | tail -n 30
grep -vE "it/s|s/it|tensor/s|widening" $OUT/logs/rounds.log | tail -n 8
