#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01j (nvidia-h200), from .snap/: the widened DeepSeek's MTP row of bench e2e (closed
# batch and steady, temperatures 0 and 0.8) with gpu_2026-12-01h call 5's warm-up and this session's chain probe.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 300 python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e --workdir /tmp/e2e_ds > $OUT/logs/e2e.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
grep -vE "it/s|s/it|tensor/s|widening|^$" $OUT/logs/e2e.log | tail -n 14
