#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): after call 3, fp8 weights back on the split-K
# kernel outside batch-invariant mode, the grouped fp8 experts on 4-stage tiles; expert-parallel routing without
# torch ops or the align kernel (632e5c9); Step-3.5's fp8 q/k/v packed (5b1138d).
#   First, one GPU each, side by side:
#   GPU 0: GPU tests (routing kernel with expert ranges, fused fp8 projections, quantized MoE); bench families
#          --quantized fp8 V2-Lite (call 1: 450.0 tok/s at batch 1; call 3: 368.3).
#   GPU 1: bench families --quantized fp8 for the Step-3.5 slice and the Qwen3-Next slice (call 3: 459.7, 979.4).
#   Then both GPUs: the expert-parallel GPU test's DeepSeek cases (graphed decode equal to one GPU, fp32); bench
#   multi step35flash,ep plain decode (--no-oracle) with rank 0's timelines.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-q -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 110 python3 -m pytest $T tests/kernels/test_moe_routing.py tests/layers/test_fused_projection_fp8.py \
      tests/kernels/test_quant_moe_kernels.py > $OUT/logs/t_gpu.log 2>&1; echo "t_gpu rc=$?" >> $OUT/logs/t_gpu.log
  timeout $(( 200 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famV --no-verify --quantized fp8 \
      --compare-with c1famQ --shapes deepseek-v2-lite > $OUT/logs/famV.log 2>&1; echo "famV rc=$?" >> $OUT/logs/famV.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m outpace.bench.families --out $OUT/famS --no-verify --quantized fp8 --compare-with c3famQ \
      --shapes step-3.5-flash-slice,qwen3-next-80b-slice > $OUT/logs/famS.log 2>&1; echo "famS rc=$?" >> $OUT/logs/famS.log
) &
wait
timeout 110 python3 -m pytest $T tests/gpu/test_gpu_expert_parallel.py -k deepseek > $OUT/logs/t_ep.log 2>&1
echo "t_ep rc=$?" >> $OUT/logs/t_ep.log
MULTI_NO_ORACLE=1 MULTI_TIME_LIMIT=$(( 470 - SECONDS )) timeout $(( 490 - SECONDS )) bash benchmarks/scripts/gpu_run.sh \
    $OUT/multi multi step35flash,ep > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
for d in famV famS; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_gpu t_ep; do echo "== $n"; grep -E "passed|failed|FAILED|rc=" $OUT/logs/$n.log | tail -n 8; done
for d in famV famS; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 9; done
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run" | tail -16
for f in $OUT/multi/timeline_*; do echo "== $f"; head -2 $f | tail -1; tail -1 $f; done
