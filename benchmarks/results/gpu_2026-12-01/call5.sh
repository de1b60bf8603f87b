#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the expert-parallel GPU test's DeepSeek
# case at EP = TP = 2 (never run on a GPU before), with the push all-reduce and the fused add + norm; rerun
# (call 6) with CASE / LIMIT naming the MTP and bf16 cases.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
timeout ${LIMIT:-300} python3 -m pytest -v -p no:cacheprovider --tb=short -rf \
    "tests/gpu/test_gpu_expert_parallel.py::${CASE:-test_expert_parallel_captured_decode_equals_one_gpu_fp32[2-deepseek]}" \
    > $OUT/logs/t_ep.log 2>&1
echo "t_ep rc=$?" >> $OUT/logs/t_ep.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -E "FAILED|ERROR| failed| passed|rc=|Error" $OUT/logs/t_ep.log | tail -n 8
