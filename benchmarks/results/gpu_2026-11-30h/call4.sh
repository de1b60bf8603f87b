#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the route kernel at 4 warps for more than
# 256 experts (c0403a9).
#   GPU 0: tests/kernels/test_moe_routing.py (captured routes, the layout's ticket, at the new warps);
#          families --quantized fp8 Qwen3-Next slice (30g call 3: 1187.2 tok/s at batch 1).
#   GPU 1: families bf16 Qwen3-Next slice and Step-3.5 slice (call 3: Step 640.1).
#   Then both: bench multi qwen3next80b, plain decode (call 3: 252.4 tok/s at batch 1).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest $T tests/kernels/test_moe_routing.py > $OUT/logs/t_route.log 2>&1
  echo "t_route rc=$?" >> $OUT/logs/t_route.log
  timeout $(( 300 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQq --no-verify --quantized fp8 \
      --compare-with c3famQ --shapes qwen3-next-80b-slice > $OUT/logs/famQq.log 2>&1; echo "famQq rc=$?" >> $OUT/logs/famQq.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 280 python3 -m outpace.bench.families --out $OUT/famB --no-verify --compare-with c3famSb \
      --shapes qwen3-next-80b-slice,step-3.5-flash-slice > $OUT/logs/famB.log 2>&1; echo "famB rc=$?" >> $OUT/logs/famB.log
) &
wait
timeout $(( 560 - SECONDS )) python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi'), 'qwen3next80b', Plan(seed_oracle=False, time_limit_s=$(( 545 - SECONDS ))),
                    workdir=Path('.e2e_models'))" > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
for d in famQq famB; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_route"; grep -c PASSED $OUT/logs/t_route.log; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_route.log | tail -n 8
for d in famQq famB; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 9; done
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run|skip" | tail -8
