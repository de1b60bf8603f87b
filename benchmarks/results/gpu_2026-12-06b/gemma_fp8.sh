#!/usr/bin/env bash
# Gemma's fused sandwich layers over fp8 q/k/v (commit 848856f): the decode step's kernels and span at batch 1 under
# the profiler (step_timeline.py) before (the change reverted in a copy of outpace/) and after, then bench families
# --quantized fp8 on gemma-3-12b after, as long as the budget lasts.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT /tmp/before
cp -r outpace benchmarks /tmp/before/
sed -i 's/and fusable_qkv(x, attn.qkv.weight)/and fusable_rows(x, attn.qkv.weight)/; s/^    fusable_qkv,$/    fusable_qkv,\n    fusable_rows,/' \
  /tmp/before/outpace/layers/fused_sandwich.py
for side in before after; do
  root=$PWD; [ $side = before ] && root=/tmp/before
  (cd $root && PYTHONPATH=. timeout 60 python3 benchmarks/scripts/step_timeline.py /tmp/tl_$side gemma-3-12b@1 \
    --quantized fp8 --lines 2 2>&1 | grep -E "kernels and|span|Error" | sed "s/^/$side: /" | tee -a $OUT/timeline.log)
done
PYTHONPATH=. timeout 100 python3 -m outpace.bench.families --out $OUT/fam --no-verify --quantized fp8 \
  --shapes gemma-3-12b > $OUT/fam.log 2>&1
echo "rc=$?" >> $OUT/fam.log
sed -i -E 's/\r/\n/g' $OUT/fam.log
grep -E "%|rc=|Error" $OUT/fam.log | tail -n 5
