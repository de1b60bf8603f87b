#!/usr/bin/env bash
# Device call 21 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# call 20 found the widened Qwen3.5's MTP step no faster at batch 1 over narrow windows (the chooser's chain-2
# step 4.368 ms against call 19's 4.367); here the narrow and whole windows' captured steps of one engine side by
# side at batch 1, 8 and 32 (benchmarks/scripts/narrow_window_ab.py), MTP then EAGLE3 on the same target.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
for m in mtp eagle3; do
  left=$((440 - SECONDS)); [ $m = mtp ] && left=260
  [ $left -gt 60 ] && timeout $left python3 benchmarks/scripts/narrow_window_ab.py $OUT/logs/ab_$m.json qwen35:$m \
    --batches 1 8 32 --workdir /tmp/e2e_q > $OUT/logs/ab_$m.log 2>&1
  echo "rc=$?" >> $OUT/logs/ab_$m.log
done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
for m in mtp eagle3; do tar xzf $OUT/logs.tgz -O logs/ab_$m.log | grep -E "^b|rc=|Error" | tail -n 12; done
