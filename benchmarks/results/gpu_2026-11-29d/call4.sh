#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x4), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: bench families over the Qwen3-Next and DeepSeek-V3 slices after the MoE sort's rewrite (call 3's
#          profile: the routing kernel's one-program sort took 144 us a layer at batch 32), beside call 1;
#   GPU 1: the routing and grouped-expert kernel tests (the rewritten sort on the GPU; call 2 ran out of time
#          at the prefill-sized test), then the quantized-expert kernel tests call 3 did not reach;
#   GPU 2: tests/gpu/test_gpu_moe_families.py;  GPU 3: tests/gpu/test_fp8_kv_cache_gpu.py.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf --durations=10 -s"
( export CUDA_VISIBLE_DEVICES=0
  timeout 205 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 900 \
      --compare-with call1_fam --shapes qwen3-next-80b-slice,deepseek-v3-slice > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 205 python3 -m pytest $T tests/kernels/test_moe_routing.py tests/kernels/test_moe_kernel.py \
      tests/kernels/test_family_routers.py tests/kernels/test_quant_moe_kernels.py > $OUT/logs/tests_kernels.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests_kernels.log ) &
( export CUDA_VISIBLE_DEVICES=2
  timeout 205 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py > $OUT/logs/tests_families.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests_families.log ) &
( export CUDA_VISIBLE_DEVICES=3
  timeout 205 python3 -m pytest $T tests/gpu/test_fp8_kv_cache_gpu.py > $OUT/logs/tests_fp8kv.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests_fp8kv.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "shape|slice|kernels|rc=" | tail -12
for f in tests_kernels tests_families tests_fp8kv; do
  echo "== $f"; grep -E "passed|failed|FAILED|ERROR|rc=|match" $OUT/logs/$f.log | tail -n 12
done
