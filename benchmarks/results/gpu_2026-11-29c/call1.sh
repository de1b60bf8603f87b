#!/usr/bin/env bash
# Device call 1 of the session of 2026-11-29 (fourth), on nvidia-h200-x2, from .snap/ (a git archive of HEAD):
# issue 45's captured-iteration check under expert parallelism on two GPUs, then issue 46's item 1 (graph
# replays with NCCL inside at TP = 2, per-rank memory sizing, hybrids at TP = 2) and item 3 (Qwen3-Next-80B-A3B
# whole, bf16, TP = 2, decode vs the floor and MTP under oracle acceptance).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,memory.total --format=csv
timeout 110 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -s tests/gpu/test_gpu_expert_parallel.py \
    tests/bench/test_multi_gpu_issue46.py -k "expert or parallel or profiled" > $OUT/logs/ep_tests.log 2>&1
echo "ep tests rc=$?" >> $OUT/logs/ep_tests.log
MULTI_TIME_LIMIT=400 timeout 440 bash benchmarks/scripts/gpu_run.sh $OUT/multi46 multi item1,qwen3next80b \
    > $OUT/logs/multi.log 2>&1; echo "multi rc=$?" >> $OUT/logs/multi.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/ep_tests.log | tail -n 25
grep -v "%|" $OUT/logs/multi.log | tail -n 45
