#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-03c (nvidia-h200): after call 4 prompt 1's difference at position 40 remains. Is
# it contraction in another kernel? The diagnostic again with every Triton kernel compiled without contraction
# (TRITON_DEFAULT_FP_FUSION=0: Triton's default for kernels that do not set enable_fp_fusion themselves).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
(cd .snap && TRITON_DEFAULT_FP_FUSION=0 PYTHONPATH=. timeout 170 python3 \
  benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py > $OUT/diag.log 2>&1)
grep -v "it/s\]" $OUT/diag.log | tail -14
