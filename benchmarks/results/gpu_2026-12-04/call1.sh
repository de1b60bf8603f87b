#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04 (nvidia-h200), from the checkout: one row on the CUDA cores (quant_matmul_kernel.py
# and moe_kernels.py ONE-ROW). (1) The changed kernels' GPU tests; (2) one_row_products.py: the dense fp8 product and
# one token's grouped experts, one-row settings against the 16-row tiles; (3) decode_settings.py one_row_v2_fp8: the
# paths on and off in block-FP8 DeepSeek-V2-Lite's decode step at batch 1.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=line -rfE tests/kernels/test_fp8_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_moe_kernel.py tests/kernels/test_quant_moe_path.py \
  tests/kernels/test_moe_batch_invariant.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 240 python3 benchmarks/scripts/one_row_products.py $OUT/one_row.json > $OUT/one_row.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/one_row.log
timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/v2_fp8.json one_row_v2_fp8 \
  > $OUT/v2_fp8.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log one_row.log v2_fp8.log $(cd $OUT && ls *.json 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
grep -v Warning $OUT/one_row.log | grep -E "floor|rc=|wrong|Error" | tail -n 30
grep -v Warning $OUT/v2_fp8.log | tail -n 8
