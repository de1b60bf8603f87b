#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), both GPUs, one after the other:
#   the symmetric-memory all-reduce's two-GPU test; issue 45/46's expert-parallel GPU tests with it inside the
#   captured steps (greedy tokens equal to one GPU's in fp32); then Step-3.5-Flash whole in block FP8 at
#   EP = TP = 2 again (call 2: 36.7% of the floor at batch 1 with 90 NCCL all-reduces of 17.5 us a step).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf --durations=10 -s"
timeout 90 python3 -m pytest $T tests/gpu/test_gpu_symmetric_all_reduce.py > $OUT/logs/symm.log 2>&1
echo "symm rc=$?" >> $OUT/logs/symm.log
timeout 230 python3 -m pytest $T tests/gpu/test_gpu_expert_parallel.py > $OUT/logs/ep.log 2>&1
echo "ep rc=$?" >> $OUT/logs/ep.log
MULTI_TIME_LIMIT=$(( 520 - SECONDS )) timeout $(( 550 - SECONDS )) bash benchmarks/scripts/gpu_run.sh \
    $OUT/multi multi step35flash > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== symm"; grep -E "passed|failed|FAILED|Error|rc=" $OUT/logs/symm.log | tail -6
echo "== ep"; grep -E "PASSED|FAILED|passed|failed|rc=" $OUT/logs/ep.log | tail -10
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|all-reduces|target|rc=|Error" | tail -30
