#!/usr/bin/env bash
# Device call 12 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# Mamba2's step kernels under programmatic dependent launch, the norm kernel at 8 warps (3a92b7d): their GPU
# tests (bf16 at Nemotron-H-8B's shape against the eager path, inside a CUDA graph), in the session's last
# device seconds.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -m gpu tests/kernels/test_mamba2_step.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
tail -n 6 $OUT/logs/pytest.log
