#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-01h (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the GPU test files over the session's changes (every engine's start-up warm-up, routing and fused rows without
# their token counts specialised): the captured zoo decode and every drafter lossless, and DeepSeek's GPU tests.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 150 python3 -m pytest $T tests/gpu/test_gpu.py -k "not eager" > $OUT/logs/t_gpu.log 2>&1
echo "rc=$?" >> $OUT/logs/t_gpu.log
timeout $(( 290 - SECONDS )) python3 -m pytest $T tests/gpu/test_gpu_deepseek.py > $OUT/logs/t_ds.log 2>&1
echo "rc=$?" >> $OUT/logs/t_ds.log
tar czf $OUT/logs.tgz -C $OUT logs
for t in t_gpu t_ds; do echo "== $t"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$t.log | tail -n 6; done
