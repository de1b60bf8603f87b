#!/usr/bin/env bash
# Device call 7 of gpu_2026-12-04c (nvidia-h200), at b36292a's code (pairs apart for INT4 stacks up to 8 tokens, block
# FP8 in the layout): (1) GPU tests of the grouped and quantized kernels and the quantized checkpoints; (2) bench
# families in INT4 on the DeepSeek-V3 and Kimi-K2 slices.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py tests/kernels/test_moe_kernel.py \
  tests/kernels/test_moe_batch_invariant.py tests/models/test_quantized_checkpoints.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout $(( 420 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log fam_int4.log $(cd $OUT && find fam_int4 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warning $OUT/fam_int4.log | tail -n 9
