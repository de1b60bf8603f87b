#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-03d (nvidia-h200): call 2 found the step kernel's run-length compilations at
# fault (a token's float32 state other in the chain of 3 than in every one-token variant). Now batch-invariant
# mode launches one compilation for every run length: the DeltaNet step file compiled; variant_bits.py; the
# hybrid batch-invariant tests with their strict xfail run as plain tests; the diagnostic; the mode's cost on
# Qwen3.5 and the Qwen3-Next slice (gpu_2026-12-01b call 2: -2.1% / -1.3%, -10.9% / -2.2%).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
here=$PWD
cd .snap; export PYTHONPATH=.
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_deltanet_step.py -rfE --tb=line 2>&1 \
  | grep -E "passed|failed|FAILED" | sed -E 's/ - .*//' > $OUT/step_tests.log
PYTHONPATH=.:tests timeout 100 python3 $here/benchmarks/results/gpu_2026-12-03d/variant_bits.py > $OUT/variants.log 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider --runxfail tests/gpu/test_batch_invariant_hybrids_gpu.py \
  -rfE --tb=line 2>&1 | grep -E "passed|failed|FAILED" | sed -E 's/ - .*//' > $OUT/hybrid_tests.log
timeout 150 python3 benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py > $OUT/diag.log 2>&1
timeout $(( 590 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py --shapes qwen3.5,qwen3-next-80b-slice \
  --out $OUT/bi_speed.json > $OUT/bi_speed.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tail -n 12 $OUT/step_tests.log
tail -n 6 $OUT/variants.log
tail -n 8 $OUT/hybrid_tests.log
grep -v Warning $OUT/diag.log | tail -n 20
tail -n 12 $OUT/bi_speed.log
