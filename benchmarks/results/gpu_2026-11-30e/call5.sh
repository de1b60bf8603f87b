#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: DeepSeek-V2-Lite block FP8 with the down kernel back at 16 outputs a program for FP8 (beside calls 2
#          and 4); the MoE kernels' GPU tests that call 4 cut at 150 s (programmatic dependent launch).
#   GPU 1: the batch-invariant mode's cost on Llama-3.1-8B at 128 KV rows a split (context 512).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 130 python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --compare-with c2famQ c4famQ --shapes deepseek-v2-lite > $OUT/logs/famQ.log 2>&1
  echo "famQ rc=$?" >> $OUT/logs/famQ.log
  timeout $(( 350 - SECONDS )) python3 -m pytest -q tests/kernels/test_moe_kernel.py tests/kernels/test_moe_routing.py \
      > $OUT/logs/t_moe.log 2>&1; echo "t_moe rc=$?" >> $OUT/logs/t_moe.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 350 python3 benchmarks/scripts/batch_invariant_speed.py --contexts 512 --out $OUT/logs/binvL.json \
      > $OUT/logs/binvL.log 2>&1; echo "binvL rc=$?" >> $OUT/logs/binvL.log ) &
wait
cp $OUT/famQ/families.json $OUT/logs/families_famQ.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== famQ"; grep -v "%|" $OUT/logs/famQ.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 6
echo "== t_moe"; grep -E "passed|failed|Error|rc=" $OUT/logs/t_moe.log | tail -n 4
echo "== binvL"; grep -E "tokens/s|rc=" $OUT/logs/binvL.log | tail -n 8
