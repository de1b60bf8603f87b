#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): tests/gpu/test_gpu_expert_parallel.py's
# captured-decode cases for Qwen3-Next at EP = 2 (TP = 1 and 2; the earlier calls only reached the DeepSeek
# case before their limits), after c786584 (the EP combine's skips) and this session's kernels: captured EP
# decode equal to one GPU in fp32.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
timeout 480 python3 -m pytest -v -p no:cacheprovider --tb=short -rf tests/gpu/test_gpu_expert_parallel.py \
    -k "captured_decode and qwen3_next" > $OUT/logs/t_ep.log 2>&1
echo "t_ep rc=$?" >> $OUT/logs/t_ep.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -E "PASSED|FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_ep.log | tail -n 12
