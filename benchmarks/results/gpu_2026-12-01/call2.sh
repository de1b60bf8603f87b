#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the all-reduce + residual add + RMSNorm
# kernel (c69e4f5).
#   Both GPUs: tests/gpu/test_gpu_symmetric_all_reduce.py (now with the fused kernel against the two launches);
#   if it passed: bench multi qwen3next80b (call 1: 302.9 tok/s at batch 1), then bench multi item1 (the
#   hybrid Qwen3-Next slice at TP = 2: fp32 equal to TP = 1, the bf16 match rate; the fused path in bf16).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 240 python3 -m pytest $T tests/gpu/test_gpu_symmetric_all_reduce.py > $OUT/logs/t_ar.log 2>&1
rc=$?; echo "t_ar rc=$rc" >> $OUT/logs/t_ar.log
if [ $rc -eq 0 ]; then
  for parts in qwen3next80b item1; do
    timeout $(( 570 - SECONDS )) python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi_$parts'), '$parts', Plan(seed_oracle=False, time_limit_s=$(( 555 - SECONDS ))),
                    workdir=Path('.e2e_models'))" > $OUT/logs/multi_$parts.log 2>&1
    echo "multi rc=$?" >> $OUT/logs/multi_$parts.log
    mkdir -p $OUT/logs/multi_$parts; cp $OUT/multi_$parts/multi_gpu.json $OUT/multi_$parts/timeline_* $OUT/logs/multi_$parts/ 2>/dev/null
  done
fi
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_ar"; grep -E "FAILED|ERROR| failed| passed|rc=|Error" $OUT/logs/t_ar.log | tail -n 8
for p in qwen3next80b item1; do echo "== multi $p"; grep -v "%|" $OUT/logs/multi_$p.log 2>/dev/null | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run|skip|match|equal" | tail -16; done
