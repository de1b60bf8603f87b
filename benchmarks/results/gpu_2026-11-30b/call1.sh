#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the decode step's kernel chain (step_timeline.py) of the shapes furthest from their floor at batch 1,
#          with programmatic dependent launch on and off (off: each kernel's own time); kernels by name without it;
#   GPU 1: bench e2e --family qwen35 at batch 32 (MTP and EAGLE3 against plain, after b1a311f: the chooser's
#          cached reaches).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  S=benchmarks/scripts/step_timeline.py
  timeout 200 python3 $S $OUT/logs/tl_pdl deepseek-v2-lite@1 qwen3-next-80b-slice@1 gemma-4-26b-a4b@1 --lines 0 > $OUT/logs/tl.log 2>&1
  OUTPACE_PDL=0 timeout 200 python3 $S $OUT/logs/tl_nopdl deepseek-v2-lite@1 qwen3-next-80b-slice@1 gemma-4-26b-a4b@1 --lines 0 >> $OUT/logs/tl.log 2>&1
  OUTPACE_PDL=0 timeout 150 python3 benchmarks/scripts/family_kernels.py $OUT/logs/k_nopdl deepseek-v2-lite@1 qwen3-next-80b-slice@1 > $OUT/logs/k.log 2>&1
  echo "gpu0 done rc=$?" >> $OUT/logs/tl.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 540 python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 --methods none mtp eagle3 \
      --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tl"; grep -E "span|kernels and|Error|rc=" $OUT/logs/tl.log | tail -n 12
echo "== k"; head -n 14 $OUT/logs/k_nopdl/kernels_deepseek-v2-lite@1.txt
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 22
