#!/usr/bin/env bash
# Device call 22: the GPU tests that call 19's 240 s limit left without a summary, first the prefill graphs' own
# (the captured absorbs; a hybrid's chunks of 64 tokens or more replaying flash-linear-attention's batched chunked
# kernels, after 2962f31), then the DeepSeek and MoE families' files; the slowest tests listed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE --durations=12 tests/gpu/test_gpu.py \
  -k "absorb or hybrid_prefill or prefill_chunks" > $OUT/pytest_prefill.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_prefill.log
timeout $(( 560 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE --durations=12 \
  tests/gpu/test_gpu_deepseek.py tests/gpu/test_gpu_moe_families.py > $OUT/pytest_moe.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_moe.log
sed -i -E 's/\r/\n/g' $OUT/*.log
grep -h -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest_prefill.log $OUT/pytest_moe.log | tail -n 20
