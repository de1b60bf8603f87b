#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-04b (nvidia-h200): INT4 one row on the CUDA cores (quant_matmul_kernel._int4_row_part,
# for one token's grouped experts and one row's products): (1) the INT4 GPU tests; (2) int4_tiles.py --one-row;
# (3) bench/quant_kernels.py INT4; (4) bench families in INT4 on the DeepSeek-V3 and Kimi-K2 slices.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 120 python3 benchmarks/scripts/int4_tiles.py $OUT/one_row.json --one-row > $OUT/one_row.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/one_row.log
QK='from outpace.bench.quant_kernels import report_linear, report_moe
report_linear(formats=("int4",), rows=(1, 8))
report_moe(tokens=(1, 8, 32))'
timeout 90 python3 -c "$QK" > $OUT/qk.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/qk.log
timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log one_row.log qk.log fam_int4.log $(cd $OUT && find one_row.json fam_int4 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warn $OUT/one_row.log | tail -n 30
grep -v Warn $OUT/qk.log | grep -E "M |  1 |tokens|^ +[0-9]+ +[0-9]+ " | cut -c1-75
grep -v Warning $OUT/fam_int4.log | tail -n 9
