#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-04b (nvidia-h200): the INT4 one-token tiles (8, 512, 1, 1): (1) the INT4 GPU tests;
# (2) bench families in INT4 on the DeepSeek-V3 and Kimi-K2 slices.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout $(( 330 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log fam_int4.log $(cd $OUT && find fam_int4 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warning $OUT/fam_int4.log | tail -n 9
