#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-04b (nvidia-h200): with K_TILED (INT4 words and scales masked by rows alone where K
# is whole tiles, so the pipeline streams them): (1) the INT4 GPU tests; (2) int4_tiles.py; (3) bench/quant_kernels.py
# INT4 (products, grouped experts) with the PTX nibbles on.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 240 python3 benchmarks/scripts/int4_tiles.py $OUT/int4_tiles.json > $OUT/tiles.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tiles.log
QK='from outpace.bench.quant_kernels import report_linear, report_moe
report_linear(formats=("int4",), rows=(1, 8, 64))
report_moe(tokens=(1, 8, 32, 64))'
timeout 100 python3 -c "$QK" > $OUT/qk.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/qk.log
sed -i -E 's/\r/\n/g' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log tiles.log qk.log $(cd $OUT && ls int4_tiles.json 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warn $OUT/tiles.log | grep -E "experts|rc=" | awk '{print $2, $3, $4, $5, $6, $7, $8, $9, $10, $11}' | tail -n 64
grep -v Warn $OUT/tiles.log | grep dense | awk '$4 != 16' | cut -c1-90
grep -v Warn $OUT/qk.log | tail -n 36 | cut -c1-75
