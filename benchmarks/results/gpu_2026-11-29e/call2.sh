#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD):
#   first, side by side: GPU 0 routing_timings.py (the router matvec after its few-token rewrite, the route
#   kernel at 1-8 warps); GPU 1 the block-FP8 linear's GPU tests (torch's GEMM with DeepSeek-V2-Lite's 22 K
#   blocks padded, call 1's failure);
#   then both GPUs: issue 46 item 3, `bench multi step35flash`: Step-3.5-Flash whole in block FP8 at EP = TP = 2.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 benchmarks/scripts/routing_timings.py $OUT/routing > $OUT/logs/routing.log 2>&1
  echo "routing rc=$?" >> $OUT/logs/routing.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 100 python3 -m pytest -v -p no:cacheprovider --tb=short -rf tests/kernels/test_fp8_linear.py \
      > $OUT/logs/fp8_linear.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/fp8_linear.log ) &
wait
MULTI_TIME_LIMIT=$(( 530 - SECONDS )) timeout $(( 560 - SECONDS )) bash benchmarks/scripts/gpu_run.sh \
    $OUT/multi multi step35flash > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/logs/ 2>/dev/null; cp $OUT/routing/routing_timings.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== routing"; cat $OUT/logs/routing.log | grep -v Warn | tail -14
echo "== fp8 linear"; grep -E "passed|failed|FAILED|rc=" $OUT/logs/fp8_linear.log | tail -6
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | tail -40
