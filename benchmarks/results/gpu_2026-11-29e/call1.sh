#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the GPU cases of the corrected Step-3.5 / Gemma 4 block tests, the quantized-expert kernel tests
#          earlier calls did not reach and the sandwich norms' bf16 cases; then where the Qwen3-Next and
#          DeepSeek-V3 slices' batch-1 decode steps go after the router matvec change (be8edc3);
#   GPU 1: bench families (bf16) over the MoE shapes beside gpu_2026-11-29d call 4, then DeepSeek-V2-Lite in
#          block FP8 (issue 44's table).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 250 python3 -m pytest -v -p no:cacheprovider --tb=short -rf --durations=15 \
      tests/kernels/test_family_routers.py tests/kernels/test_quant_moe_kernels.py \
      tests/layers/test_sandwich_norms.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log
  timeout $(( 540 - SECONDS )) python3 benchmarks/scripts/family_kernels.py $OUT/kernels \
      qwen3-next-80b-slice@1 deepseek-v3-slice@1 qwen3-next-80b-slice@32 > $OUT/logs/kernels.log 2>&1
  echo "kernels rc=$?" >> $OUT/logs/kernels.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 360 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 350 \
      --compare-with call4_fam \
      --shapes qwen3-next-80b-slice,deepseek-v3-slice,deepseek-v2-lite,step-3.5-flash-slice,gemma-4-26b-a4b \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log
  timeout $(( 540 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam8 --quantized fp8 --no-verify \
      --shapes deepseek-v2-lite > $OUT/logs/fam8.log 2>&1
  echo "fam8 rc=$?" >> $OUT/logs/fam8.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null; cp $OUT/fam8/families.json $OUT/logs/families_fp8.json 2>/dev/null
cp -r $OUT/kernels $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; grep -E "passed|failed|FAILED|ERROR|rc=" $OUT/logs/tests.log | tail -n 15
for f in fam fam8; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | tail -n 14; done
echo "== kernels"; grep -v "%|" $OUT/logs/kernels.log | grep -E "layers|ms " | head -45
