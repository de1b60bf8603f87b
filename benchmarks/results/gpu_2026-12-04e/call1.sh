#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04e (nvidia-h200), at the commit holding this script: (1) GPU tests of what the last
# session wrote after its last call (SiLU gating in the fp8 product's store, RowEpilogue.swiglu; the norm folded into
# the fp8 q/k/v/gate product, norm_project_qkv_gate); (2) bench families in block FP8: Qwen3-Next slice, Step-3.5
# slice, V2-Lite (kernels a step expected: Qwen3-Next slice and Step slice fewer); (3) the wide one-row fp8 tiles
# (quant_matmul_kernel.one_row_wide_tiles, off) against the shipped ones inside the Qwen3-Next slice's decode step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_fp8_linear.py \
  tests/kernels/test_family_routers.py tests/kernels/test_gated_attention.py tests/layers/test_fused_projection.py \
  tests/gpu/test_gpu_moe_families.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/layers/test_fused_projection_fp8.py \
  > $OUT/pytest_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_fp8.log
timeout 200 python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes qwen3-next-80b-slice,step-3.5-flash-slice,deepseek-v2-lite > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
timeout $(( 575 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/wide_qwen3next.json \
  one_row_wide_qwen3next_fp8 > $OUT/wide.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/wide.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find fam_fp8 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log $OUT/pytest_fp8.log | tail -n 12
grep -v Warning $OUT/fam_fp8.log | tail -n 10
tail -n 4 $OUT/wide.log
