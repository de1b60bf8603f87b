#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-03c (nvidia-h200): call 3 found the first differing stream at a gated DeltaNet
# layer's output; the step kernel's decode and verify compilations now run without floating-point contraction
# in batch-invariant mode. 1. the diagnostic again; 2. the strict-xfail test run as a plain one (--runxfail)
# with the rest of its file; 3. the step kernels' GPU tests (DeltaNet, Mamba2).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
(cd .snap && PYTHONPATH=. timeout 200 python3 benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py \
  > $OUT/diag.log 2>&1)
grep -v "it/s\]" $OUT/diag.log | tail -12
(cd .snap && PYTHONPATH=. timeout 200 python3 -m pytest -q --runxfail tests/gpu/test_batch_invariant_hybrids_gpu.py \
  > $OUT/pytest_invariant.log 2>&1)
tail -6 $OUT/pytest_invariant.log
(cd .snap && PYTHONPATH=. timeout $((560 - SECONDS)) python3 -m pytest -q tests/kernels/test_deltanet_step.py \
  tests/kernels/test_mamba2_step.py > $OUT/pytest_steps.log 2>&1)
tail -6 $OUT/pytest_steps.log
