#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side, after c39b27b
# (16-output sub-tiles at BK 512 x 5 stages; MLA 32 KB tiles) and 52e39f6 (QKV with per-head norms split in two
# kernels where whole heads leave SMs idle):
#   GPU 0: bench families for Gemma-3-12B, Gemma 4 and DeepSeek-V2-Lite beside gpu_2026-11-30b calls 3 / 4;
#   GPU 1: the fused projection GPU tests, bench families for the Qwen3-Next slice, Qwen3.5 and Nemotron-H,
#          then step timelines of Gemma-3-12B and Gemma 4 at batch 1 without PDL.
# Copy gpu_2026-11-30b call3/fam (c3fam) and call4/fam (c4fam) into .snap.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 540 python3 -m outpace.bench.families --out $OUT/famA --no-verify --compare-with c4fam c3fam \
      --shapes gemma-3-12b,gemma-4-26b-a4b,deepseek-v2-lite > $OUT/logs/famA.log 2>&1
  echo "famA rc=$?" >> $OUT/logs/famA.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 100 python3 -m pytest -q tests/layers/test_fused_projection.py tests/layers/test_gemma_fused.py \
      > $OUT/logs/t_fused.log 2>&1; echo "t_fused rc=$?" >> $OUT/logs/t_fused.log
  timeout 360 python3 -m outpace.bench.families --out $OUT/famB --no-verify --compare-with c4fam c3fam \
      --shapes qwen3-next-80b-slice,qwen3.5,nemotron-h-8b > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log
  OUTPACE_PDL=0 timeout $(( 545 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl_nopdl \
      gemma-3-12b@1 gemma-4-26b-a4b@1 --lines 0 > $OUT/logs/tl.log 2>&1
  echo "tl rc=$?" >> $OUT/logs/tl.log ) &
wait
cp $OUT/famA/families.json $OUT/logs/familiesA.json 2>/dev/null; cp $OUT/famB/families.json $OUT/logs/familiesB.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_fused"; tail -n 2 $OUT/logs/t_fused.log
for f in famA famB; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 14; done
echo "== tl"; grep -E "kernels and|Error|rc=" $OUT/logs/tl.log | tail -n 4
