#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side, after the
# MLA merge (d5758d0), the attention's in-kernel split merge, the hybrids' fused residual path (761d221), the
# run-ahead saves by _foreach_copy_ (66abe89) and Mamba2's 64-row scan blocks (0430d0c):
#   GPU 0: the GPU tests of those kernels and paths, then bench families for DeepSeek-V2-Lite, Gemma 4 and
#          Gemma-3-12B beside call 2;
#   GPU 1: bench families for the Qwen3-Next slice, Qwen3.5 and Nemotron-H beside call 2.
# Copy call2/famA (c2famA) and call2/famB (c2famB) into .snap.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 130 python3 -m pytest -q -x tests/gpu/test_gpu_moe_families.py -k fused_residual \
      tests/kernels/test_triton_attention.py tests/kernels/test_mla_kernel.py > $OUT/logs/t_gpu.log 2>&1
  echo "t_gpu rc=$?" >> $OUT/logs/t_gpu.log
  timeout $(( 395 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famA --no-verify --compare-with c2famA \
      --shapes deepseek-v2-lite,gemma-4-26b-a4b,gemma-3-12b > $OUT/logs/famA.log 2>&1
  echo "famA rc=$?" >> $OUT/logs/famA.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 395 python3 -m outpace.bench.families --out $OUT/famB --no-verify --compare-with c2famB \
      --shapes qwen3-next-80b-slice,qwen3.5,nemotron-h-8b > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log ) &
wait
cp $OUT/famA/families.json $OUT/logs/familiesA.json 2>/dev/null; cp $OUT/famB/families.json $OUT/logs/familiesB.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_gpu"; grep -E "passed|failed|Error|rc=" $OUT/logs/t_gpu.log | tail -n 6
for f in famA famB; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 14; done
