#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (the code of call 4): Step-3.5-Flash whole in block FP8 at EP = TP = 2,
# plain decode with rank 0's timeline only (call 4 ran out of its limit before it). Its item budgeted at 90 s
# (call 1: 52 s) through bench multi's Python API, the CLI's estimate being 200 s.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
timeout 190 python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi'), 'step35flash', Plan(step35flash_item_s=90, seed_oracle=False,
                    time_limit_s=170), workdir=Path('.e2e_models'))" > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run" | tail -10
for f in $OUT/multi/timeline_*; do echo "== $f"; head -2 $f | tail -1; tail -1 $f; done
