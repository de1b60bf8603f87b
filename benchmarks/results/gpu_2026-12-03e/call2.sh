#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-03e (nvidia-h200): (1) the bit tests after call 1's findings: the DeltaNet and
# Mamba2 steps' one compilation for chains and trees in batch-invariant mode, every drafter on tinyqwen35, the
# router logits' per-token sums at every count; (2) the router logits' time in the mode; (3) where the mode's
# step time goes against the GPU's (wall, replays, GPU busy and span); (4) the mode's cost.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_mamba2_step.py \
  tests/kernels/test_deltanet_step.py tests/gpu/test_batch_invariant_hybrids_gpu.py \
  tests/kernels/test_moe_batch_invariant.py -rfE --tb=short > $OUT/tests.log 2>&1
echo "rc=$?" >> $OUT/tests.log
(cd benchmarks/scripts && PYTHONPATH=../..:. timeout 60 python3 invariant_router_logits.py $OUT \
  qwen3-next-80b deepseek-v2-lite) > $OUT/router.log 2>&1
timeout 110 python3 benchmarks/scripts/invariant_step_gap.py $OUT qwen3-next-80b-slice@1 > $OUT/gap.log 2>&1
timeout $(( 575 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py \
  --shapes qwen3-next-80b-slice,nemotron-h-8b,qwen3.5 --out $OUT/invariant_speed.json > $OUT/speed.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/tests.log | tail -n 20
grep -v Warning $OUT/router.log | tail -n 10
grep -v Warning $OUT/gap.log | tail -n 4
grep -v Warning $OUT/speed.log | tail -n 8
