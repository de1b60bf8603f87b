#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03d (nvidia-h200): where the hybrid's batch-invariant MTP bits part from plain
# decoding's. (1) The engine's two DeltaNet step launches (decode into the row; MTP's chain verify, its end in
# the row) compared bit for bit, float32 states included, at tinyqwen35's shape in bf16, 16 seeds; (2) the
# diagnostic, now also recording every step launch's projections, start state and output; (3) every test
# marked gpu, in the time left.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_deltanet_step.py \
  -k "mtp_verify_has or chain_has_the_bits" -rfE --tb=line > $OUT/bits_test.log 2>&1
timeout 200 python3 benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py > $OUT/diag.log 2>&1
timeout $(( 585 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadscope -m gpu --tb=line -rfE \
  tests > $OUT/pytest_gpu.log 2>&1
echo "rc=$?" >> $OUT/pytest_gpu.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -E "passed|failed|FAILED|Error" $OUT/bits_test.log | tail -n 20
grep -v Warning $OUT/diag.log | tail -n 40
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest_gpu.log | tail -n 30
