#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04d (nvidia-h200), at the commit holding this script: (1) GPU tests of the kernels
# changed since the last GPU run (a shared MLP beside the experts joins their combine; INT4 pairs apart up to 4
# tokens); (2) bench families: INT4 on the DeepSeek-V3 and Kimi-K2 slices, block FP8 on Step-3.5's slice; (3) the
# kernels of one decode step (OUTPACE_PDL=0: each kernel's own time) of the shapes furthest from the floor.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_family_routers.py \
  tests/kernels/test_moe_kernel.py tests/kernels/test_quant_moe_path.py tests/kernels/test_quant_moe_kernels.py \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 150 python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
timeout 90 python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes step-3.5-flash-slice > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
export OUTPACE_PDL=0
timeout $(( 560 - SECONDS )) bash -c "python3 benchmarks/scripts/step_timeline.py $OUT/tl deepseek-v2-lite@1 gemma-4-26b-a4b@1 \
  qwen3-next-80b-slice@1 --lines 0 && python3 benchmarks/scripts/step_timeline.py $OUT/tl deepseek-v2-lite@1 \
  qwen3-next-80b-slice@1 --quantized fp8 --lines 0" > $OUT/tl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
gzip -k $OUT/tl/*.txt 2>/dev/null
tar -czf $OUT/logs.tgz -C $OUT pytest.log fam_int4.log fam_fp8.log tl.log $(cd $OUT && find fam_int4 fam_fp8 tl -name "*.json" -o -name "*.txt.gz" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warning $OUT/fam_int4.log | tail -n 9
grep -v Warning $OUT/fam_fp8.log | tail -n 6
tail -n 3 $OUT/tl.log
