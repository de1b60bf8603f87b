#!/usr/bin/env bash
# Device call 9 of gpu_2026-12-04c (nvidia-h200), at 0be2510 (INT4 pairs apart up to 4 tokens): bench families in INT4
# on the DeepSeek-V3 and Kimi-K2 slices.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 170 python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT fam_int4.log $(cd $OUT && find fam_int4 -name "*.json" 2>/dev/null)
grep -v Warning $OUT/fam_int4.log | tail -n 9
