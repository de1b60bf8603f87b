#!/usr/bin/env bash
# Device call 7 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script), on
# the session's last ~280 s of device time: the GPU test files that call 4's limit cut before they ran, DeepSeek's
# (its MTP layer routes a draft window's padding rows nowhere since 849e4db) first.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 170 python3 -m pytest -v -p no:cacheprovider --tb=short -rf tests/gpu/test_gpu_deepseek.py \
  tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
grep -E "PASSED|FAILED|ERROR|XFAIL|SKIPPED|passed|failed|rc=" $OUT/logs/pytest.log | tail -n 40
