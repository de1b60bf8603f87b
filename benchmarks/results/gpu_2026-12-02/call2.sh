#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# where the widened Qwen3.5's MTP step spends its time over a plain step (call 1: 3.92 ms plain, 4.52 with one
# draft, 4.58 with two), kernel by kernel at 1, 2 and 3 tokens a sequence.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/tl
timeout 400 python3 benchmarks/scripts/verify_timeline.py $OUT/tl e2e:qwen35:mtp@1 --workdir /tmp/e2e_q35 \
  > $OUT/tl/verify_timeline.log 2>&1
echo "rc=$?" >> $OUT/tl/verify_timeline.log
sed -i -E 's/\r/\n/g' $OUT/tl/verify_timeline.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/tl/verify_timeline.log
tar czf $OUT/tl.tgz -C $OUT tl && rm -rf $OUT/tl
tar xzf $OUT/tl.tgz -O tl/verify_timeline.log | grep -vE "widening|capturing" | tail -n 60
