#!/usr/bin/env bash
# Device call 7 of gpu_2026-12-04d (nvidia-h200), the session's last device seconds: one row of an fp8 weight that
# fills the GPU in the wide tiles (quant_matmul_kernel.one_row_wide_tiles): its tests on the GPU, then the Qwen3-Next
# slice's block-FP8 decode step at batch 1 with the tiles and without (decode_settings.py, two passes each).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 40 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE tests/kernels/test_fp8_linear.py -k "one_row" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout $(( 125 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/wide_qwen3next.json \
  one_row_wide_qwen3next_fp8 > $OUT/wide.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/wide.log
sed -i -E 's/\r/\n/g' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log wide.log $(cd $OUT && ls *.json 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 5
grep -v Warning $OUT/wide.log | tail -n 8
