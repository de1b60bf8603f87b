#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-04d (nvidia-h200), at the commit holding this script: (1) GPU tests of the routers and
# the fused projections; (2) bench families, INT4 on the Kimi-K2 and DeepSeek-V3 slices and block FP8 on Step-3.5's
# (a shared MLP beside the experts now reads the stream through the norm-folding projections: one launch fewer a MoE
# layer than call 1); (3) routing_timings.py at the big routers (one token's route kernel at 1, 2, 4, 8 warps, now
# that the one-token layout comes from registers).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_family_routers.py \
  tests/layers/test_fused_projection.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 150 python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
timeout 90 python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes step-3.5-flash-slice > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
timeout $(( 560 - SECONDS )) python3 benchmarks/scripts/routing_timings.py $OUT/rt qwen3-next-80b step-3.5-flash \
  deepseek-v3 gemma-4-26b-a4b deepseek-v2-lite > $OUT/rt.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/rt.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log fam_int4.log fam_fp8.log rt.log $(cd $OUT && find fam_int4 fam_fp8 rt -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warning $OUT/fam_int4.log | tail -n 9
grep -v Warning $OUT/fam_fp8.log | tail -n 5
grep -v Warning $OUT/rt.log | tail -n 70
