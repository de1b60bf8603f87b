#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the plain few-row projection's tile sweep (plain_tiles.py); the MLA block's GPU tests (the k_pe fix
#          78c3869, the block-FP8 projections d495af2);
#   GPU 1: bench families (bf16) for the MLA shapes and Qwen3-Next beside call 2; DeepSeek-V2-Lite in block FP8
#          beside gpu_2026-11-29e call 3, and where its step goes; then bench e2e --family qwen35 at batch 32.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 benchmarks/scripts/plain_tiles.py $OUT/logs/plain_tiles.json > $OUT/logs/tiles.log 2>&1
  echo "tiles rc=$?" >> $OUT/logs/tiles.log
  timeout $(( 560 - SECONDS )) python3 -m pytest -v -p no:cacheprovider --tb=short -rf --durations=10 \
      tests/kernels/test_mla_fused.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 190 \
      --compare-with call2_fam --shapes deepseek-v2-lite,deepseek-v3-slice,qwen3-next-80b-slice \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log
  timeout 100 python3 -m outpace.bench.families --out $OUT/fam8 --quantized fp8 --no-verify \
      --compare-with e_call3_fam8 --shapes deepseek-v2-lite > $OUT/logs/fam8.log 2>&1
  echo "fam8 rc=$?" >> $OUT/logs/fam8.log
  timeout 70 python3 benchmarks/scripts/family_kernels.py $OUT/logs/kernels deepseek-v2-lite@1:fp8 \
      > $OUT/logs/kernels.log 2>&1
  echo "kernels rc=$?" >> $OUT/logs/kernels.log
  timeout $(( 560 - SECONDS )) python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 \
      --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null; cp $OUT/fam8/families.json $OUT/logs/families_fp8.json 2>/dev/null
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tiles"; grep -E "default|rc=" $OUT/logs/tiles.log | tail -n 20
echo "== tests"; grep -E "passed|failed|FAILED|ERROR|rc=" $OUT/logs/tests.log | tail -n 12
for f in fam fam8; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v verify | tail -n 14; done
echo "== kernels"; grep -v "%|" $OUT/logs/kernels.log | grep -E "layers|ms " | head -14
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | tail -n 25
