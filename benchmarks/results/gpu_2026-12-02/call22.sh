#!/usr/bin/env bash
# Device call 22 of gpu_2026-12-02 (nvidia-h200): call 20's Qwen3.5 row at batch 32 (4030.6 tok/s, 58.8% of the
# floor) fell 9.6% below call 10's (4459.7, 64.3%; Gemma-3-12B's batch 32 did not move against gpu_2026-12-01c).
# An A/B on one machine: the same families command from .snap_old (a git archive of 543bcfd, call 10's commit)
# and from .snap (the commit holding this script), old then new, in the 415 s of device time left.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
for run in old new; do
  dir=.snap; [ $run != new ] && dir=.snap_old
  left=$((370 - SECONDS))
  [ $left -gt 100 ] && (cd $dir && PYTHONPATH=. timeout $left python3 -m outpace.bench.families --out /tmp/fam_$run \
    --no-verify --time-limit $((left - 20)) --shapes qwen3.5 > $OUT/logs/fam_$run.log 2>&1; echo "rc=$?" >> $OUT/logs/fam_$run.log)
done
cp /tmp/fam_*/families.json $OUT/logs/ 2>/dev/null
for run in old new old2; do [ -f /tmp/fam_$run/families.json ] && cp /tmp/fam_$run/families.json $OUT/logs/families_$run.json; done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
for run in old new old2; do echo "== $run"; tar xzf $OUT/logs.tgz -O logs/fam_$run.log 2>/dev/null | grep -E "qwen3.5|kernels|rc=" | tail -n 5; done
