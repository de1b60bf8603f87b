#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side, then both:
#   GPU 0: the GPU tests of what changed (the MLA block's q_absorb parts, the MoE combine's grid, the fused
#          plain projection); then where DeepSeek-V2-Lite, Gemma 4, Qwen3.5 and Nemotron-H steps go now;
#   GPU 1: bench families (bf16) beside call 1;
#   both: the expert-parallel GPU test's Qwen3-Next case (call 4 of gpu_2026-11-29e ran out of time in it).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -v -p no:cacheprovider --tb=short -rf --durations=10 \
      tests/kernels/test_mla_fused.py tests/kernels/test_moe_kernel.py tests/layers/test_fused_projection.py \
      tests/kernels/test_skinny_gemm.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log
  timeout $(( 420 - SECONDS )) python3 benchmarks/scripts/family_kernels.py $OUT/logs/kernels \
      deepseek-v2-lite@1 qwen3.5@8 nemotron-h-8b@8 gemma-4-26b-a4b@1 kimi-k2-slice@1 > $OUT/logs/kernels.log 2>&1
  echo "kernels rc=$?" >> $OUT/logs/kernels.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 420 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 380 \
      --compare-with call1_fam \
      --shapes deepseek-v2-lite,qwen3.5,nemotron-h-8b,gemma-4-26b-a4b,kimi-k2-slice,qwen3-next-80b-slice,deepseek-v3-slice \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
wait
timeout $(( 575 - SECONDS )) python3 -m pytest -v -s -p no:cacheprovider --tb=short -rf \
    "tests/gpu/test_gpu_expert_parallel.py::test_expert_parallel_captured_decode_equals_one_gpu_fp32[1-qwen3_next]" \
    > $OUT/logs/ep.log 2>&1
echo "ep rc=$?" >> $OUT/logs/ep.log
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; grep -E "passed|failed|FAILED|ERROR|rc=" $OUT/logs/tests.log | tail -n 12
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -v "^\s*$" | grep -v verify | tail -n 30
echo "== ep"; grep -E "PASSED|FAILED|passed|failed|rc=" $OUT/logs/ep.log | tail -4
echo "== kernels"; grep -v "%|" $OUT/logs/kernels.log | grep -E "layers|ms " | awk '/layers/{n=0} {n++; if (n<=12) print}'
