#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04e (nvidia-h200): the grouped experts over quantized stacks (gate/up, down, combine)
# with programmatic dependent launch against without (moe_kernels.quantized_pdl, shipped False after a run that
# changed another thing too; gpu_2026-12-03g's sweep was cut after its first pass): V2-Lite and the Qwen3-Next slice
# in block FP8, the Kimi-K2 slice in INT4, decode at batch 1 and 8.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
for sweep in moe_pdl_v2_fp8 moe_pdl_qwen3next_fp8 moe_pdl_kimi_int4; do
  timeout $(( 585 - SECONDS < 200 ? 585 - SECONDS : 200 )) python3 benchmarks/scripts/decode_settings.py \
    $OUT/$sweep.json $sweep > $OUT/$sweep.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
for f in $OUT/moe_pdl_*.log; do grep -v Warn $f | tail -n 4; done
