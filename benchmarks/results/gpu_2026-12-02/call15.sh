#!/usr/bin/env bash
# Device call 15 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# after 5192316 (one draft's stack a view, the window's rows gathered only for a reused layer), the widened
# Qwen3.5's MTP and EAGLE3 rows at batch 1 (EAGLE3 chains draft through the greedy head too: 5dd238b) and the
# MTP step's kernels, then the widened DeepSeek's EAGLE3 row as time allows.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 260 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp eagle3 --out /tmp/out_q \
  --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
timeout 100 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 --workdir /tmp/e2e_q \
  > $OUT/logs/tl/verify_timeline.log 2>&1
rm -rf /tmp/e2e_q
left=$((560 - SECONDS))
if [ $left -gt 100 ]; then
  timeout $left python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none eagle3 \
    --out /tmp/out_d --workdir /tmp/e2e_d > $OUT/logs/e2e_deepseek.log 2>&1
  echo "rc=$?" >> $OUT/logs/e2e_deepseek.log
  cp /tmp/out_d/*.json $OUT/logs/ 2>/dev/null
fi
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A8 "^method|rc=" | tail -n 9
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log | grep -E "kernel time"
tar xzf $OUT/logs.tgz -O logs/e2e_deepseek.log 2>/dev/null | grep -E -A6 "^method|rc=" | tail -n 7
