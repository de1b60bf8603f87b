#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04e (nvidia-h200): (1) the fp8 projection tests again (call 1: the q/k/v/gate test's
# dense reference was float32 beside bf16 rows, which the bf16 kernel refuses on the GPU); (2) bench families in block
# FP8 on the Step-3.5 slice and V2-Lite (call 1's 200 s held only the Qwen3-Next slice); (3) the wide one-row fp8
# tiles in the Qwen3-Next slice's decode step (call 1's sweep sized the KV pool for one request too small).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 60 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/layers/test_fused_projection_fp8.py \
  > $OUT/pytest_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_fp8.log
timeout 280 python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes step-3.5-flash-slice,deepseek-v2-lite > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
timeout $(( 580 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/wide_qwen3next.json \
  one_row_wide_qwen3next_fp8 > $OUT/wide.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/wide.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find fam_fp8 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest_fp8.log | tail -n 6
grep -v -E "Warn|^ *$" $OUT/fam_fp8.log | tail -n 12
grep -v Warn $OUT/wide.log | tail -n 5
