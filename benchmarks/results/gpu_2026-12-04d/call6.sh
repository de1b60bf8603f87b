#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-04d (nvidia-h200): call 5 measured the INT4 slices 4-5% slower at batch 1 after
# ab9d55b (the shared MLP beside the experts reads the stream through the norm-folding projections). The kernels of
# one Kimi-K2 slice decode step (INT4, batch 1, OUTPACE_PDL=0) before (.snap_a: git archive of ab9d55b~1 =
# 672744c) and after (this commit), one after the other on one machine.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_PDL=0
mkdir -p $OUT/before $OUT/after
PYTHONPATH=.snap_a timeout 150 python3 .snap_a/benchmarks/scripts/step_timeline.py $OUT/before kimi-k2-slice@1 \
  --quantized int4 --lines 0 > $OUT/tl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl.log
PYTHONPATH=. timeout 150 python3 benchmarks/scripts/step_timeline.py $OUT/after kimi-k2-slice@1 \
  --quantized int4 --lines 0 >> $OUT/tl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl.log
for d in before after; do for f in $OUT/$d/*.txt; do mv "$f" $OUT/$d/kimi_int4_b1.txt; done; done
tar -czf $OUT/logs.tgz -C $OUT tl.log before after
tail -n 4 $OUT/tl.log
for d in before after; do echo "== $d"; cut -c30-70 $OUT/$d/kimi_int4_b1.txt | sort | uniq -c | sort -rn | head -14; tail -n 1 $OUT/$d/kimi_int4_b1.txt; done
