#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one after the other:
#   DeepSeek-V2-Lite in block FP8 after its kv_b_proj is dequantized once at load (call 3: 828 kernels a step,
#   16.3% of the floor at batch 1), beside call 3; then the expert-parallel GPU test's Qwen3-Next fp32 case
#   that call 4 ran out of time in (with the symmetric-memory all-reduce inside the captured steps).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 95 python3 -m outpace.bench.families --out $OUT/fam8 --quantized fp8 --no-verify \
      --compare-with call3_fam8 --shapes deepseek-v2-lite > $OUT/logs/fam8.log 2>&1
  echo "fam8 rc=$?" >> $OUT/logs/fam8.log )
timeout $(( 195 - SECONDS )) python3 -m pytest -v -s -p no:cacheprovider --tb=short -rf \
    "tests/gpu/test_gpu_expert_parallel.py::test_expert_parallel_captured_decode_equals_one_gpu_fp32[1-qwen3_next]" \
    > $OUT/logs/ep.log 2>&1
echo "ep rc=$?" >> $OUT/logs/ep.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== fam8"; grep -v "%|" $OUT/logs/fam8.log | grep -E "deepseek|kernels|rc=" | tail -6
echo "== ep"; grep -E "PASSED|FAILED|passed|failed|rc=" $OUT/logs/ep.log | tail -4
