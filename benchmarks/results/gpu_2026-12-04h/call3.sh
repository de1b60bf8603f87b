#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-04h (nvidia-h200): the architectures added in a session without a GPU. (1) their
# GPU tests: Qwen3-MoE's, Qwen3.5-MoE's, Nemotron-H latent MoE's and Mixtral's (added 2026-12-05) captured
# decode, grouped kernels and fused residual stack; Ministral 3's query scaling on the fused q/k/v path
# (tests/gpu/test_gpu_query_scaling.py, added 2026-12-05)
# (tests/gpu/test_gpu_moe_families.py);
# (2) bench families at their public shapes, whole models in bf16: Qwen3-30B-A3B and Qwen3.5-35B-A3B (batch 1, 8,
# 32 against the floor, kernels a step).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 180 python3 -m pytest -v -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/gpu/test_gpu_moe_families.py \
  tests/gpu/test_gpu_query_scaling.py -k "qwen3_moe or qwen3_5_moe or latent or mixtral or scales_queries" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout $(( 580 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes qwen3-30b-a3b,qwen3.5-35b-a3b > $OUT/fam.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log fam.log $(cd $OUT && find fam -name "*.json" 2>/dev/null)
grep -E " (PASSED|FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
grep -v Warning $OUT/fam.log | tail -n 9
