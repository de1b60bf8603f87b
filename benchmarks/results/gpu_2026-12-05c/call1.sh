#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-05c: what gpu_2026-12-05b left for the next device session. Mistral 4's GPU test (and
# Mixtral's and DeepSeek-V3's beside it), and the settings sweep on Qwen3-30B-A3B's decode step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 140 python3 -m pytest -v -p no:cacheprovider -n 3 --tb=short -rfE -m gpu tests/gpu/test_gpu_moe_families.py \
  -k "test_the_fused_residual_path_gives_the_cpu_tokens_fp32 and (mistral4 or v3-yarn or mixtral)" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 330 python3 benchmarks/scripts/decode_settings.py $OUT/a3b_qwen3.json a3b_qwen3 > $OUT/settings.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E " (PASSED|FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warning $OUT/settings.log | tail -n 13
