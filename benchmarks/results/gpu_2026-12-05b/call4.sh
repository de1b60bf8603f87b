#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-05b (nvidia-h200): where Qwen3-30B-A3B's and Qwen3.5-35B-A3B's batch-1 decode step
# goes (call 1: 50.0% and 50.6% of the floor, 488 and 349 kernels a step): kernels by name (family_kernels.py) and
# one step kernel by kernel without PDL (step_timeline.py, OUTPACE_PDL=0), each file renamed without '@'.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/k $OUT/t
timeout 200 python3 benchmarks/scripts/family_kernels.py $OUT/k qwen3-30b-a3b qwen3.5-35b-a3b > $OUT/kernels.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/kernels.log
OUTPACE_PDL=0 timeout 200 python3 benchmarks/scripts/step_timeline.py $OUT/t qwen3-30b-a3b@1 qwen3.5-35b-a3b@1 \
  --lines 0 > $OUT/tl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for f in $OUT/k/* $OUT/t/*; do n=$(basename "$f" | tr '@:' '__'); gzip -c "$f" > $OUT/$n.gz; done
rm -rf $OUT/k $OUT/t
grep -v Warning $OUT/kernels.log | grep -vE "^\s*$" | head -n 60
grep -v Warning $OUT/tl.log | tail -n 4
