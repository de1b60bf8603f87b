#!/usr/bin/env bash
# Device call 8 of gpu_2026-12-04c (nvidia-h200): decode_settings.py pairs_apart_v3_int4 (call 7's DeepSeek-V3 slice in
# INT4 at batch 8: 1943.7 tok/s against 2080.3 before pairs apart, gpu_2026-12-04b call 6).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 200 python3 benchmarks/scripts/decode_settings.py $OUT/pairs_apart_v3_int4.json pairs_apart_v3_int4 > $OUT/ds.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/ds.log
sed -i -E 's/\r/\n/g' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT ds.log $(cd $OUT && ls *.json 2>/dev/null)
grep -v Warn $OUT/ds.log | tail -n 8
