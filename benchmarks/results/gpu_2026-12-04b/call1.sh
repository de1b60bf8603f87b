#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04b (nvidia-h200), from the checkout at 4178ffb (INT4 nibbles by PTX):
# (1) the INT4 GPU tests; (2) the INT4 products and grouped experts alone (bench/quant_kernels.py) with the PTX
# nibbles off (OUTPACE_INT4_PTX=0) and on; (3) bench families in INT4 (Kimi-K2-Thinking's layout) on the
# DeepSeek-V3 and Kimi-K2 slices, on and off.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
QK='from outpace.bench.quant_kernels import report_linear, report_moe
report_linear(formats=("int4",), rows=(1, 8, 64))
report_moe(tokens=(1, 8, 32, 64))'
for v in 0 1; do
  OUTPACE_INT4_PTX=$v timeout 100 python3 -c "$QK" > $OUT/qk$v.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/qk$v.log
done
for v in 1 0; do
  OUTPACE_INT4_PTX=$v timeout $(( v == 1 ? 130 : 580 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam$v \
    --no-verify --quantized int4 --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam$v.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/fam$v.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log qk0.log qk1.log fam0.log fam1.log $(cd $OUT && find fam0 fam1 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
paste -d'|' <(grep -v Warn $OUT/qk0.log | cut -c1-80) <(grep -v Warn $OUT/qk1.log | cut -c40-80) | tail -n 40
grep -v Warning $OUT/fam1.log | tail -n 9
grep -v Warning $OUT/fam0.log | tail -n 9
