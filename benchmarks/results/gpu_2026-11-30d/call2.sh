#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: verify_timeline.py (the captured step verifying 1, 2, 3 tokens a sequence, kernels by name) for
#          Qwen3.5, Nemotron-H and DeepSeek-V2-Lite at batch 1; the MLA kernel file again after c7f364d.
#   GPU 1: the MoE families' GPU tests and the fused MLA block's, each with room to finish.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/vt qwen3.5@1 nemotron-h-8b@1 \
      deepseek-v2-lite@1 > $OUT/logs/vt.log 2>&1; echo "vt rc=$?" >> $OUT/logs/vt.log
  timeout $(( 500 - SECONDS )) python3 -m pytest -q tests/kernels/test_mla_kernel.py > $OUT/logs/test_mla_kernel.log 2>&1
  echo "test_mla_kernel rc=$?" >> $OUT/logs/test_mla_kernel.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 260 python3 -m pytest -q tests/gpu/test_gpu_moe_families.py > $OUT/logs/test_gpu_moe_families.log 2>&1
  echo "test_gpu_moe_families rc=$?" >> $OUT/logs/test_gpu_moe_families.log
  timeout $(( 500 - SECONDS )) python3 -m pytest -q tests/kernels/test_mla_fused.py > $OUT/logs/test_mla_fused.log 2>&1
  echo "test_mla_fused rc=$?" >> $OUT/logs/test_mla_fused.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
for n in test_mla_kernel test_gpu_moe_families test_mla_fused; do
  echo "== $n"; grep -E "passed|failed|error|rc=" $OUT/logs/$n.log | tail -n 3; done
echo "== vt"; grep -v "%|\|warming" $OUT/logs/vt.log | head -n 60
