#!/usr/bin/env bash
# Device call 1: the new kernels' tests on the GPU (the working tree as it is), then the seed families at
# their public shapes on the code of 83e3598 ("before"), bench/families.py copied into it.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
PYTHONPATH=. timeout 250 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_moe_kernel.py \
  tests/kernels/test_moe_routing.py tests/kernels/test_deltanet_step.py tests/kernels/test_mamba2_step.py \
  tests/kernels/test_mla_fused.py tests/kernels/test_mla_kernel.py tests/layers/test_fused_families.py \
  tests/layers/test_gemma_fused.py tests/layers/test_batch_invariant.py tests/gpu/ 2>&1 \
  | tee $OUT/gpu_tests1.log | grep -E "passed|failed|FAILED|ERROR|Error" | tail -40
cp outpace/bench/families.py outpace/bench/family_shapes.py .before/outpace/bench/
cd .before && PYTHONPATH=. timeout 330 python3 -m outpace.bench.families --out $OUT/before --time-limit 280 \
  --shapes deepseek-v2-lite,qwen3.5,gemma-3-12b,nemotron-h-8b,deepseek-v3-slice,qwen3-next-80b-slice,step-3.5-flash-slice,gemma-4-26b-a4b,kimi-k2-slice \
  2>&1 | grep -v "it/s\]" | tee $OUT/before.log | tail -30
