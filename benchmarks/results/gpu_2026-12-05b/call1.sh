#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-05b (nvidia-h200): every GPU test written in sessions without a GPU, in one call
# (gpu_2026-12-04h call 2's and call 3's tests, gpu_2026-12-05 call 1's), then gpu_2026-12-04h call 3's bench
# families on Qwen3-30B-A3B and Qwen3.5-35B-A3B (whole models, bf16).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
t() {  # NAME SECONDS PYTEST-ARGS...
  name=$1; secs=$2; shift 2
  timeout $secs python3 -m pytest -v -p no:cacheprovider -n 4 --tb=short -rfE "$@" > $OUT/$name.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$name.log
}
t int4 120 -m gpu tests/kernels/test_int4_linear.py tests/kernels/test_quant_moe_kernels.py
t families 180 -m gpu tests/gpu/test_gpu_moe_families.py tests/gpu/test_gpu_query_scaling.py \
  -k "qwen3_moe or qwen3_5_moe or latent or mixtral or scales_queries"
t fp8_channel 150 tests/kernels/test_fp8_linear.py tests/kernels/test_quant_moe_path.py \
  tests/layers/test_fused_projection_fp8.py -k "per_channel or fp8_channel"
timeout $(( 575 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes qwen3-30b-a3b,qwen3.5-35b-a3b > $OUT/fam.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log) $(cd $OUT && find fam -name "*.json" 2>/dev/null)
for f in int4 families fp8_channel; do echo "== $f"; grep -E "(FAILED|ERROR)|passed|failed|rc=" $OUT/$f.log | tail -n 8; done
echo "== fam"; grep -v Warning $OUT/fam.log | tail -n 9
