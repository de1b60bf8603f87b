#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the GPU tests of the DeltaNet decode split (b58dfd1), Gemma 4's fused MoE-layer attention, GatedMLP's
#          fused gating (project_swiglu) and the plain projection's sub-tiles (call 4's run ran out of time);
#          then where Gemma 4's batch-1 step goes;
#   GPU 1: bench families (bf16) for Qwen3.5, the Qwen3-Next slice, Gemma 4, DeepSeek-V2-Lite and the
#          Step-3.5-Flash slice beside call 4.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      tests/kernels/test_deltanet_step.py tests/layers/test_gemma_fused.py tests/layers/test_fused_projection.py \
      > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log
  timeout $(( 275 - SECONDS )) python3 benchmarks/scripts/family_kernels.py $OUT/logs/kernels \
      gemma-4-26b-a4b@1 > $OUT/logs/kernels.log 2>&1
  echo "kernels rc=$?" >> $OUT/logs/kernels.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 275 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 265 \
      --compare-with call4_famA call4_famB \
      --shapes qwen3.5,qwen3-next-80b-slice,gemma-4-26b-a4b,deepseek-v2-lite,step-3.5-flash-slice \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; grep -E "passed|failed|FAILED|ERROR|rc=" $OUT/logs/tests.log | tail -n 12
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -v "^\s*$" | grep -v -i "warn\|legend" | tail -n 24
echo "== kernels"; grep -v "%|" $OUT/logs/kernels.log | grep -E "layers|ms |rc=" | head -24
