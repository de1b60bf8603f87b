#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-05b (nvidia-h200), within the session's last device seconds: Mistral 4's GPU test
# (captured decode on the fused MLA path with the query scale by position, stacked experts on the grouped kernels,
# against the CPU's greedy tokens), and Mixtral's and DeepSeek-V3's beside it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 150 python3 -m pytest -v -p no:cacheprovider -n 3 --tb=short -rfE -m gpu tests/gpu/test_gpu_moe_families.py \
  -k "test_the_fused_residual_path_gives_the_cpu_tokens_fp32 and (mistral4 or v3-yarn or mixtral)" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E " (PASSED|FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
