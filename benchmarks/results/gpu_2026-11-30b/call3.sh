#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: bench families (plain decode b1/8/32 against the floor) for V2-Lite, Qwen3.5, Nemotron-H, Gemma-3-12B
#          after the two-stage argmax, MLA's 64-row splits and the one-launch run-ahead save, beside the latest
#          figures (gpu_2026-11-30 call 1 fam: V2-Lite, Gemma; call 6 famA/famB: the hybrids);
#   GPU 1: the Qwen3-Next slice likewise, then the GPU tests of what changed (hybrids' batch-invariant mode,
#          run-ahead, argmax, MoE families, graphs).
# Copy gpu_2026-11-30's call1/fam, call6/famA, call6/famB into .snap as c1fam, c6famA, c6famB.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 560 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 500 \
      --compare-with c1fam c6famA c6famB --shapes deepseek-v2-lite,qwen3.5,nemotron-h-8b,gemma-3-12b \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 -m outpace.bench.families --out $OUT/famN --no-verify \
      --compare-with c6famA c6famB --shapes qwen3-next-80b-slice > $OUT/logs/famN.log 2>&1
  echo "famN rc=$?" >> $OUT/logs/famN.log
  timeout $(( 565 - SECONDS )) python3 -m pytest -q tests/gpu/test_batch_invariant_hybrids_gpu.py \
      tests/gpu/test_batch_invariant_gpu.py tests/layers/test_argmax.py tests/gpu/test_gpu_moe_families.py \
      tests/engine/test_cuda_graphs.py tests/gpu/test_gpu.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null; cp $OUT/famN/families.json $OUT/logs/familiesN.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 16
echo "== famN"; grep -v "%|" $OUT/logs/famN.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 6
echo "== tests"; grep -E "passed|failed|FAILED|Error" $OUT/logs/tests.log | tail -n 14
