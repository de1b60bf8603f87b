#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-03d (nvidia-h200): call 1 found token 0's float32 state of MTP's verify chain other
# than plain decoding's (16 of 16 seeds, through the layer). Is it the kernel (the same projections fed to each
# launch variant: variant_bits.py, and the test's "kernel alone" case) or the in-projections (the "layer" case)?
# Then the diagnostic (its step-launch record fixed: call 1 read deltanet_step's arguments one place off).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
here=$PWD
cd .snap; export PYTHONPATH=.
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_deltanet_step.py -k "mtp_verify_has" \
  -rfE --tb=line 2>&1 | grep -E "passed|failed|FAILED" | sed -E 's/ - .*//' > $OUT/bits_test.log
PYTHONPATH=.:tests timeout 100 python3 $here/benchmarks/results/gpu_2026-12-03d/variant_bits.py > $OUT/variants.log 2>&1
timeout 200 python3 benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py > $OUT/diag.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tail -n 40 $OUT/bits_test.log
tail -n 8 $OUT/variants.log
grep -v Warning $OUT/diag.log | tail -n 50
