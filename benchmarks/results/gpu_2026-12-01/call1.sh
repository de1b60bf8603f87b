#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the push all-reduce (dfbdcee).
#   Both GPUs: tests/gpu/test_gpu_symmetric_all_reduce.py (sums against NCCL, graphs replayed with eager calls
#   between); all_reduce_timings.py (NCCL, torch's one-shot and two-shot, push); then, if the test passed,
#   bench multi qwen3next80b (gpu_2026-11-30h call 4: 276.2 tok/s at batch 1) and ep (call 1: V3 slice 741.6,
#   Step slice 747.2).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 240 python3 -m pytest $T tests/gpu/test_gpu_symmetric_all_reduce.py > $OUT/logs/t_ar.log 2>&1
rc=$?; echo "t_ar rc=$rc" >> $OUT/logs/t_ar.log
timeout 150 python3 benchmarks/scripts/all_reduce_timings.py $OUT/ar 2 > $OUT/logs/ar.log 2>&1
echo "ar rc=$?" >> $OUT/logs/ar.log
if [ $rc -eq 0 ]; then
  for parts in qwen3next80b ep; do
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
echo "== ar"; grep -E "bf16|rc=|Error" $OUT/logs/ar.log | tail -n 6
for p in qwen3next80b ep; do echo "== multi $p"; grep -v "%|" $OUT/logs/multi_$p.log 2>/dev/null | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run|skip" | tail -12; done
