#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD = 6a8b7aa): what the last session left unrun.
#   GPU 0: tests/kernels/test_fp8_linear.py (its batch-invariant test of 8c08ff9, the split-K barrier) and the
#          batch-invariant GPU tests.
#   GPU 1: routing_timings.py (the route kernel's warps at each family's routing; Qwen3-Next's 512 experts spill
#          at 1 warp), then the hybrids' batch-invariant GPU tests.
#   Then both: bench multi ep, qwen3next80b (plain decode) and step35flash (block FP8, EP = TP = 2), after
#   bbdb09e (fused MLA under TP), e88c02e (Qwen3-Next add + norm under TP), c786584 (EP combine skips) and
#   fc2eafe (64 x 256 fp8 tiles), rank 0's batch-1 timelines.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest $T tests/kernels/test_fp8_linear.py tests/gpu/test_batch_invariant_gpu.py \
      > $OUT/logs/t_gpu0.log 2>&1; echo "t_gpu0 rc=$?" >> $OUT/logs/t_gpu0.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 80 python3 benchmarks/scripts/routing_timings.py $OUT/logs/routing > $OUT/logs/routing.log 2>&1
  echo "routing rc=$?" >> $OUT/logs/routing.log
  timeout $(( 200 - SECONDS )) python3 -m pytest $T tests/gpu/test_batch_invariant_hybrids_gpu.py \
      > $OUT/logs/t_gpu1.log 2>&1; echo "t_gpu1 rc=$?" >> $OUT/logs/t_gpu1.log
) &
wait
timeout $(( 575 - SECONDS )) python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi'), 'ep,qwen3next80b,step35flash', Plan(step35flash_item_s=100,
                    seed_oracle=False, time_limit_s=$(( 560 - SECONDS ))), workdir=Path('.e2e_models'))" \
    > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_gpu0 t_gpu1; do echo "== $n"; grep -c PASSED $OUT/logs/$n.log; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$n.log | tail -n 10; done
echo "== routing"; grep -E "tokens|rc=|Error" $OUT/logs/routing.log | cut -c1-170
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run|skip" | tail -24
