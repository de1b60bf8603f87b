#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the fused fp8 projections after the sm_90
# compile fix, the grouped experts' new fp8 product and tiles (581edd3), their settings sweeps.
#   First, one GPU each, side by side:
#   GPU 0: GPU tests of the fused projections (fp8 and bf16), fp8 linears and quantized MoE; the fused fp8
#          projection settings sweep.
#   GPU 1: the grouped fp8 experts' tile sweep (Step-3.5, Step-3.5 at EP 2, V2-Lite); bench families --quantized
#          fp8 for V2-Lite, the Step-3.5 slice and the Qwen3-Next slice.
#   Then both GPUs: bench multi step35flash (block FP8, EP = TP = 2), plain decode only, with rank 0's timeline.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs $OUT/tl
T="-q -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 170 python3 -m pytest $T tests/layers/test_fused_projection_fp8.py tests/layers/test_fused_projection.py \
      tests/kernels/test_fp8_linear.py tests/kernels/test_quant_moe_kernels.py tests/kernels/test_quant_moe_path.py \
      > $OUT/logs/t_fp8.log 2>&1; echo "t_fp8 rc=$?" >> $OUT/logs/t_fp8.log
  timeout $(( 300 - SECONDS )) python3 benchmarks/scripts/fp8_projection_settings.py $OUT/fp8_settings.json \
      > $OUT/logs/fp8_settings.log 2>&1; echo "fp8_settings rc=$?" >> $OUT/logs/fp8_settings.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 110 python3 benchmarks/scripts/moe_fp8_settings.py $OUT/moe > $OUT/logs/moe_settings.log 2>&1
  echo "moe_settings rc=$?" >> $OUT/logs/moe_settings.log
  timeout $(( 300 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --compare-with c1famQ --shapes deepseek-v2-lite,step-3.5-flash-slice,qwen3-next-80b-slice \
      > $OUT/logs/famQ.log 2>&1; echo "famQ rc=$?" >> $OUT/logs/famQ.log
) &
wait
MULTI_NO_ORACLE=1 MULTI_TIME_LIMIT=$(( 500 - SECONDS )) timeout $(( 530 - SECONDS )) bash benchmarks/scripts/gpu_run.sh \
    $OUT/multi multi step35flash > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
cp $OUT/famQ/families.json $OUT/logs/families_famQ.json 2>/dev/null
cp $OUT/fp8_settings.json $OUT/moe/moe_fp8_settings.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_fp8"; grep -E "passed|failed|FAILED|rc=" $OUT/logs/t_fp8.log | tail -n 12
echo "== fp8_settings"; grep -E "m=|rc=|Error" $OUT/logs/fp8_settings.log | cut -c1-175
echo "== moe_settings"; grep -v "%|" $OUT/logs/moe_settings.log | grep -iE "best|\*|rc=|Error" | cut -c1-160 | tail -n 24
echo "== famQ"; grep -v "%|" $OUT/logs/famQ.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 12
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run" | tail -8
for f in $OUT/multi/timeline_*; do echo "== $f"; head -2 $f | tail -1; tail -1 $f; done
