#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): fp8 weights on the fused few-row path and
# the fused path under tensor parallelism (both new, never run on a GPU).
#   First, one GPU each, side by side:
#   GPU 0: the fused projection GPU tests (bf16 and fp8), the fp8 linear tests; fp8_projection_settings.py (the
#          fused fp8 kernel's settings against quant_matmul and bf16); bench families --quantized fp8 V2-Lite.
#   GPU 1: bench families --quantized fp8 for the Step-3.5 slice and the Qwen3-Next slice (beside bf16), and the
#          Step slice's fp8 decode step timeline.
#   Then both GPUs: bench multi step35flash and qwen3next80b, plain decode only (--no-oracle), with rank 0's step
#   timelines (call 1: Step FP8 EP = 2 at 27.0% of the floor at batch 1; Qwen3-Next-80B TP = 2 at 41.5% in
#   gpu_2026-11-29d).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs $OUT/tl
T="-q -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest $T tests/layers/test_fused_projection_fp8.py tests/layers/test_fused_projection.py \
      tests/kernels/test_fp8_linear.py > $OUT/logs/t_fp8.log 2>&1; echo "t_fp8 rc=$?" >> $OUT/logs/t_fp8.log
  timeout 130 python3 benchmarks/scripts/fp8_projection_settings.py $OUT/fp8_settings.json > $OUT/logs/fp8_settings.log 2>&1
  echo "fp8_settings rc=$?" >> $OUT/logs/fp8_settings.log
  timeout $(( 285 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --compare-with c1famQ --shapes deepseek-v2-lite > $OUT/logs/famQ.log 2>&1; echo "famQ rc=$?" >> $OUT/logs/famQ.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 170 python3 -m outpace.bench.families --out $OUT/famS --no-verify --quantized fp8 \
      --shapes step-3.5-flash-slice,qwen3-next-80b-slice > $OUT/logs/famS.log 2>&1; echo "famS rc=$?" >> $OUT/logs/famS.log
  timeout $(( 285 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/tl step-3.5-flash-slice@1 \
      --quantized fp8 --lines 0 > $OUT/logs/tl_stepfp8.log 2>&1; echo "tl_stepfp8 rc=$?" >> $OUT/logs/tl_stepfp8.log
) &
wait
MULTI_NO_ORACLE=1 MULTI_TIME_LIMIT=$(( 545 - SECONDS )) timeout $(( 575 - SECONDS )) bash benchmarks/scripts/gpu_run.sh \
    $OUT/multi multi step35flash,qwen3next80b > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
for d in famQ famS; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
cp $OUT/tl/* $OUT/fp8_settings.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_fp8"; grep -E "passed|failed|FAILED|Error|rc=" $OUT/logs/t_fp8.log | tail -n 8
echo "== fp8_settings"; grep -E "m=|rc=|Error" $OUT/logs/fp8_settings.log | cut -c1-170
for d in famQ famS; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 9; done
echo "== tl_stepfp8"; tail -n 2 $OUT/logs/tl_stepfp8.log
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|all-reduces|target|rc=|Error|not run" | tail -20
for f in $OUT/multi/timeline_*; do echo "== $f"; head -2 $f | tail -1; tail -1 $f; done
