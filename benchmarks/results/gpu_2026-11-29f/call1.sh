#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the families' plain projections, skinny kernel against the fused plain kernel (projection_shapes.py);
#          then where each family's decode step goes, kernels by name (family_kernels.py);
#   GPU 1: bench families (bf16) over every single-GPU shape beside before_fam (the latest run of each shape,
#          merged), after layers/linear.py's few-row path moved to the fused plain kernel.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 benchmarks/scripts/projection_shapes.py $OUT/logs/projection_shapes.json \
      > $OUT/logs/proj.log 2>&1
  echo "proj rc=$?" >> $OUT/logs/proj.log
  timeout $(( 560 - SECONDS )) python3 benchmarks/scripts/family_kernels.py $OUT/logs/kernels \
      deepseek-v2-lite@1 gemma-4-26b-a4b@1 qwen3-next-80b-slice@1 deepseek-v2-lite@1:fp8 step-3.5-flash-slice@1 \
      qwen3.5@8 nemotron-h-8b@8 gemma-3-12b@32 deepseek-v2-lite@8 gemma-4-26b-a4b@8 qwen3.5@1 nemotron-h-8b@1 \
      > $OUT/logs/kernels.log 2>&1
  echo "kernels rc=$?" >> $OUT/logs/kernels.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 560 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 500 \
      --compare-with before_fam \
      --shapes deepseek-v2-lite,qwen3-next-80b-slice,gemma-4-26b-a4b,step-3.5-flash-slice,deepseek-v3-slice,qwen3.5,nemotron-h-8b,gemma-3-12b,kimi-k2-slice \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== proj"; grep -v "%|" $OUT/logs/proj.log | tail -n 45
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -v "^\s*$" | grep -v verify | tail -n 40
echo "== kernels"; grep -v "%|" $OUT/logs/kernels.log | grep -E "layers|ms " | awk '/layers/{n=0} {n++; if (n<=14) print}'
