#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03e (nvidia-h200): (1) what gpu_2026-12-03d wrote and checked only on the CPU:
# the Mamba2 step in batch-invariant mode, a DeltaNet tree node's bits, every drafter's bits on the hybrids;
# (2) the router logits' K step in batch-invariant mode (64 / 128 / 256 columns: time and bits);
# (3) the mode's cost on Nemotron-H-8B (the Mamba2 step's one compilation) and the Qwen3-Next slice.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 3 tests/kernels/test_mamba2_step.py \
  tests/kernels/test_deltanet_step.py tests/gpu/test_batch_invariant_hybrids_gpu.py -rfE --tb=short \
  > $OUT/tests.log 2>&1
echo "rc=$?" >> $OUT/tests.log
(cd benchmarks/scripts && PYTHONPATH=../..:. timeout 120 python3 invariant_router_logits.py $OUT \
  qwen3-next-80b deepseek-v2-lite step-3.5-flash) > $OUT/router.log 2>&1
timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py \
  --shapes nemotron-h-8b,qwen3-next-80b-slice --out $OUT/invariant_speed.json > $OUT/speed.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/tests.log | tail -n 30
grep -v Warning $OUT/router.log | tail -n 20
grep -v Warning $OUT/speed.log | tail -n 12
