#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04g (nvidia-h200): (1) on CUDA the gate/up kernel asking its experts' down rows into
# L2 (moe_kernels.prefetch_down_max_tokens: the same bits), the routing tests' GPU cases (call 1's pytest was cut at
# 88%, none failed), the MoE family GPU tests; (2) the prefetch in the decode step at batch 1 and 8: V2-Lite and the
# Qwen3-Next slice in block FP8, V2-Lite in bf16.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 8 --tb=short -rfE -m gpu \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_moe_routing.py tests/gpu/test_gpu_moe_families.py \
  > $OUT/pytest.log 2>&1
rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/pytest.log
for sweep in prefetch_down_v2_fp8 prefetch_down_qwen3next_fp8 prefetch_down_v2; do
  left=$(( 570 - SECONDS ))
  [ $left -lt 60 ] && break
  timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/$sweep.json $sweep > $OUT/$sweep.log 2>&1
  rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
for f in $OUT/prefetch_down_*.log; do tail -n 6 $f; done
