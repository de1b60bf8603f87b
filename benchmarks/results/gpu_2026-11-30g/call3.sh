#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): after call 2, the grouped experts' split K
# reverted (0eb134a: slower everywhere), large fp8 projections on 64 x 256 tiles (fc2eafe), fp8 experts allowed
# K steps over whole scale columns (sweep only; the shipped tiles unchanged).
#   GPU 0: moe_fp8_settings.py (tiles with 256/512-column K steps against the shipped); families --quantized fp8
#          Step-3.5 slice and Qwen3-Next slice (call 1 / 30f call 4: 673.4, 1200.5 tok/s at batch 1).
#   GPU 1: the GPU tests of the quantized kernels and routing (fp8 linear, quantized MoE, fused fp8, routing).
#   Then both: tests/gpu/test_gpu_expert_parallel.py's captured-decode cases (EP = 2 at TP = 1 and 2, DeepSeek
#   and Qwen3-Next, fp32 equal to one GPU).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-q -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 benchmarks/scripts/moe_fp8_settings.py $OUT/logs/moe > $OUT/logs/moe.log 2>&1
  echo "moe rc=$?" >> $OUT/logs/moe.log
  timeout $(( 250 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --compare-with c1famSq c4famS --shapes step-3.5-flash-slice,qwen3-next-80b-slice > $OUT/logs/famQ.log 2>&1
  echo "famQ rc=$?" >> $OUT/logs/famQ.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 240 python3 -m pytest -v $T tests/kernels/test_fp8_linear.py tests/kernels/test_quant_moe_kernels.py \
      tests/layers/test_fused_projection_fp8.py tests/kernels/test_moe_routing.py > $OUT/logs/t_gpu.log 2>&1
  echo "t_gpu rc=$?" >> $OUT/logs/t_gpu.log
) &
wait
timeout $(( 540 - SECONDS )) python3 -m pytest -v $T tests/gpu/test_gpu_expert_parallel.py -k captured_decode \
    > $OUT/logs/t_ep.log 2>&1
echo "t_ep rc=$?" >> $OUT/logs/t_ep.log
cp $OUT/famQ/families.json $OUT/logs/families_famQ.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_gpu"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_gpu.log | tail -n 12
grep -c PASSED $OUT/logs/t_gpu.log
echo "== t_ep"; grep -E "PASSED|FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_ep.log | tail -n 12
echo "== moe"; grep -E "best|tokens" $OUT/logs/moe.log | tail -n 16
echo "== famQ"; grep -v "%|" $OUT/logs/famQ.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 9
