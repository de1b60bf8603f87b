#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD).
#   First, one GPU each, side by side:
#   GPU 0: batch-invariant mode on the fused MLA block (unvalidated: its GPU tests), then DeepSeek-V2-Lite in block
#          FP8: one decode step's kernels (step_timeline --quantized fp8) and bench families (issue 44).
#   GPU 1: the Step-3.5-Flash slice in block FP8 on one GPU: one decode step's kernels; then the quantized kernels'
#          GPU tests after c384563 (a quantized shared MLP fused as slots).
#   Then both GPUs: bench multi step35flash (Step-3.5-Flash whole, block FP8, EP = TP = 2) with rank 0's
#   kernels of one decode step at batch 1 (issue 46: 26.3% of the floor at batch 1, never profiled).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs $OUT/tl
T="-q -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest $T tests/kernels/test_mla_fused_invariant.py tests/gpu/test_batch_invariant_gpu.py \
      tests/engine/test_batch_invariant_trees.py > $OUT/logs/t_bi.log 2>&1; echo "t_bi rc=$?" >> $OUT/logs/t_bi.log
  timeout 70 python3 benchmarks/scripts/step_timeline.py $OUT/tl deepseek-v2-lite@1 --quantized fp8 --lines 0 \
      > $OUT/logs/tl_v2fp8.log 2>&1; echo "tl_v2fp8 rc=$?" >> $OUT/logs/tl_v2fp8.log
  timeout $(( 280 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --compare-with e5famQ --shapes deepseek-v2-lite > $OUT/logs/famQ.log 2>&1; echo "famQ rc=$?" >> $OUT/logs/famQ.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 benchmarks/scripts/step_timeline.py $OUT/tl step-3.5-flash-slice@1 --quantized fp8 --lines 0 \
      > $OUT/logs/tl_stepfp8.log 2>&1; echo "tl_stepfp8 rc=$?" >> $OUT/logs/tl_stepfp8.log
  timeout $(( 280 - SECONDS )) python3 -m pytest $T tests/kernels/test_quant_moe_path.py tests/kernels/test_moe_sm90_compile.py \
      tests/kernels/test_quant_moe_kernels.py > $OUT/logs/t_quant.log 2>&1; echo "t_quant rc=$?" >> $OUT/logs/t_quant.log
) &
wait
MULTI_TIME_LIMIT=$(( 545 - SECONDS )) timeout $(( 570 - SECONDS )) bash benchmarks/scripts/gpu_run.sh \
    $OUT/multi multi step35flash > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
cp $OUT/famQ/families.json $OUT/logs/families_famQ.json 2>/dev/null; cp $OUT/tl/* $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_bi t_quant; do echo "== $n"; grep -E "passed|failed|FAILED|Error|rc=" $OUT/logs/$n.log | tail -n 8; done
for n in tl_v2fp8 tl_stepfp8; do echo "== $n"; tail -n 3 $OUT/logs/$n.log; done
echo "== famQ"; grep -v "%|" $OUT/logs/famQ.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 6
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|all-reduces|target|rc=|Error" | tail -20
for f in $OUT/multi/timeline_*; do echo "== $f"; head -3 $f; tail -1 $f; done
