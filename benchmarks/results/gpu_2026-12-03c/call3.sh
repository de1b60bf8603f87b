#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-03c (nvidia-h200): where MTP's log-probabilities leave plain decoding's in
# batch-invariant mode on the zoo's tinyqwen35 (tests/gpu/test_batch_invariant_hybrids_gpu.py's strict xfail):
# diag_hybrid_mtp_logprob_bits.py with every layer's stream (the auxiliary capture; call 2's part hooks do not fire on the fused path), the test's 4 prompts and 48 tokens, eager, batch 1.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
(cd .snap && PYTHONPATH=. timeout 400 python3 benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py \
  > $OUT/diag.log 2>&1)
grep -v "it/s\]" $OUT/diag.log | tail -40
