#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04f (nvidia-h200), the session's last: (1) GPU tests of the grouped experts with the
# down kernel summing the slots itself (COMBINE IN DOWN), the batch-invariant readied stream, Gemma 4's router test
# against a float32 copy; (2) decode_settings combine_in_down_*: the fold against the combine kernel in the decode
# step at batch 1 and 8 (V2-Lite and the Qwen3-Next slice in block FP8, V2-Lite in bf16).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 --tb=short -rfE tests/kernels/test_moe_kernel.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_moe_batch_invariant.py \
  tests/gpu/test_gpu_moe_families.py "tests/kernels/test_family_routers.py::test_gpu_gemma4_26b_router" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
for sweep in combine_in_down_v2_fp8 combine_in_down_qwen3next_fp8 combine_in_down_v2; do
  left=$(( 500 - SECONDS )); [ $left -lt 60 ] && break
  timeout $(( left < 170 ? left : 170 )) python3 benchmarks/scripts/decode_settings.py $OUT/$sweep.json $sweep \
    > $OUT/$sweep.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 10
for f in $OUT/combine_in_down_*.log; do grep -v Warn $f | tail -n 4; done
