#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04b (nvidia-h200), at cb50990 (PTX nibbles, K_TILED, the INT4 tiles): (1) GPU tests of
# the quantized and grouped kernels; (2) bench/quant_kernels.py INT4; (3) bench families in INT4 (Kimi-K2-Thinking's
# layout) and bf16 on the DeepSeek-V3 and Kimi-K2 slices.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py tests/kernels/test_moe_kernel.py \
  tests/kernels/test_fp8_linear.py tests/kernels/test_moe_batch_invariant.py tests/models/test_quantized_checkpoints.py \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
QK='from outpace.bench.quant_kernels import report_linear, report_moe
report_linear(formats=("int4",), rows=(1, 8, 64))
report_moe(tokens=(1, 8, 32, 64))'
timeout 100 python3 -c "$QK" > $OUT/qk.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/qk.log
timeout 150 python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_bf16 --no-verify \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_bf16.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_bf16.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log qk.log fam_int4.log fam_bf16.log $(cd $OUT && find fam_int4 fam_bf16 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warn $OUT/qk.log | tail -n 48 | cut -c1-75
grep -v Warning $OUT/fam_int4.log | tail -n 9
grep -v Warning $OUT/fam_bf16.log | tail -n 9
