#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-03 (nvidia-h200): 7de7463 (run-ahead restores a request the batch left out) and
# 7359720 (one warm-up stream a device) on the GPU. memory_after_close.py on 7de7463 (.snap_a) and on this commit
# (.snap), each also after clearing cuBLAS's workspaces; then every test marked gpu again, as in call 1.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
here=$PWD
for snap in .snap_a .snap; do
  (cd $snap && PYTHONPATH=. timeout 70 python3 $here/.snap/memory_after_close.py deepseek-v2-lite 2>&1 \
    | grep MEM | head -n 2 | sed "s/^MEM/MEM $snap/") >> $OUT/logs/memory.log
done
cd .snap; export PYTHONPATH=.
timeout $(( 580 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadscope -m gpu --tb=short -rfE \
  --durations=20 tests > $OUT/logs/pytest_gpu.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest_gpu.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
cp $OUT/logs/*.log $OUT/
cat $OUT/logs/memory.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/logs/pytest_gpu.log | tail -n 30
