#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: DeepSeek-V2-Lite bf16 and block FP8 after the down kernel's 32 outputs a program and the MoE kernels'
#          programmatic dependent launch (beside gpu_2026-11-30c call 4 and this session's call 2); the MoE
#          GPU tests; the quantized kernels' GPU test files (issue 44).
#   GPU 1: tests/kernels/test_deltanet_step.py after the split heuristic's change; bench e2e --family qwen35 MTP
#          at batch 1; bench families for the Qwen3-Next slice and Gemma 4 (MoE) beside gpu_2026-11-30c call 4.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 130 python3 -m outpace.bench.families --out $OUT/famA --no-verify --compare-with c4famA \
      --shapes deepseek-v2-lite > $OUT/logs/famA.log 2>&1; echo "famA rc=$?" >> $OUT/logs/famA.log
  timeout 130 python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 --compare-with c2famQ \
      --shapes deepseek-v2-lite > $OUT/logs/famQ.log 2>&1; echo "famQ rc=$?" >> $OUT/logs/famQ.log
  timeout 150 python3 -m pytest -q tests/gpu/test_gpu_moe_families.py tests/kernels/test_moe_kernel.py \
      tests/kernels/test_moe_routing.py > $OUT/logs/t_moe.log 2>&1; echo "t_moe rc=$?" >> $OUT/logs/t_moe.log
  timeout $(( 550 - SECONDS )) python3 -m pytest -q tests/kernels/test_int4_linear.py tests/kernels/test_quant_moe_path.py \
      > $OUT/logs/t_quant_a.log 2>&1; echo "t_quant_a rc=$?" >> $OUT/logs/t_quant_a.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 130 python3 -m pytest -q tests/kernels/test_deltanet_step.py > $OUT/logs/t_deltanet.log 2>&1
  echo "t_deltanet rc=$?" >> $OUT/logs/t_deltanet.log
  timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp --out $OUT/e2e \
      --workdir .e2e_models > $OUT/logs/e2e.log 2>&1; echo "e2e rc=$?" >> $OUT/logs/e2e.log
  timeout $(( 550 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famM --no-verify --compare-with c4famA \
      c4famB --shapes qwen3-next-80b-slice,gemma-4-26b-a4b > $OUT/logs/famM.log 2>&1
  echo "famM rc=$?" >> $OUT/logs/famM.log ) &
wait
for d in famA famQ famM; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
for d in famA famQ famM; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 8; done
for n in t_moe t_quant_a t_deltanet; do echo "== $n"; grep -E "passed|failed|Error|rc=" $OUT/logs/$n.log | tail -n 4; done
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 6
