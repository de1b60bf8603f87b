#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04 (nvidia-h200), from the checkout (eb5821c): (1) GPU tests of the fp8 layers and
# models on the changed paths; (2) decode_settings.py one_row_v3_fp8 and one_row_step_fp8: the one-row paths on and
# off in the decode steps of the DeepSeek-V3 and Step-3.5-Flash slices in block FP8.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=line -rfE tests/layers/test_fused_projection_fp8.py \
  tests/models/test_quantized_checkpoints.py tests/models/test_deepseek_fused.py tests/models/test_step3p5_fused.py \
  tests/models/test_hybrid_fused.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
for sweep in one_row_v3_fp8 one_row_step_fp8; do
  left=$(( 480 - SECONDS ))
  [ $left -gt 30 ] || break
  timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/$sweep.json $sweep > $OUT/$sweep.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
for f in $OUT/one_row_*.log; do grep -v Warning $f | tail -n 5; done
