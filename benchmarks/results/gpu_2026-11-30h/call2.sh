#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x4, lent for the first time), from .snap/ (a git archive of HEAD): issue 46 item 2 at
# EP = 4: bench multi ep (DeepSeek-V3 slice and Step-3.5-Flash slice, bf16, EP = TP = 4), plain decode at batch 1,
# 8, 32 and MTP under ORACLE acceptance, rank 0's batch-1 timelines. (Step-3.5-Flash whole in block FP8 cannot
# split over 4 ranks: its shared expert's 1280 rows are 10 blocks of 128; bench multi refuses it by name.)
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
nvidia-smi -L > $OUT/logs/gpus.log
timeout 570 python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi'), 'ep', Plan(world=4, time_limit_s=540), workdir=Path('.e2e_models'))" \
    > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/multi/*.png $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
cat $OUT/logs/gpus.log
grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|all-reduces|target|rc=|Error|not run|skip" | tail -30
