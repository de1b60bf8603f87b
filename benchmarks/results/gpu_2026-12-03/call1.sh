#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# every test marked `gpu` (issue 43's "the GPU test files pass on the H200"), four workers on the one GPU, each
# file's tests in one worker (loadscope), the slowest 40 listed; the log comes back whole.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/logs/gpu.txt 2>&1
timeout 560 python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadscope -m gpu --tb=short -rfE \
  --durations=40 tests > $OUT/logs/pytest_gpu.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest_gpu.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
cp $OUT/logs/pytest_gpu.log $OUT/
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/logs/pytest_gpu.log | tail -n 40
