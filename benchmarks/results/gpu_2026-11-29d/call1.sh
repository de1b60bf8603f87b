#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x4), from .snap/ (a git archive of HEAD). Side by side, one GPU each:
#   GPUs 0-2: issue 43 item 6, `bench e2e --family deepseek | qwen35 | gemma` (the zoo's family targets widened
#             into DeepSeek-V2-Lite, Qwen3.5 and Gemma-3-12B shapes, their drafts with real acceptance);
#   GPU 3:    `bench families` (bf16) over the shapes whose fusions of the last session were never measured
#             (Qwen3-Next's gated shared expert in the routed experts, Gemma 4's sandwich norms), then the GPU
#             runs of those kernels' tests and the FP8 KV cache's, then the router-margin diagnosis (issue 46).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
for i in 0 1 2; do
  fam=(deepseek qwen35 gemma); f=${fam[$i]}
  ( export CUDA_VISIBLE_DEVICES=$i
    timeout 520 python3 -m outpace bench e2e --family $f --out $OUT/e2e_$f --workdir .e2e_models \
        > $OUT/logs/e2e_$f.log 2>&1; echo "e2e $f rc=$?" >> $OUT/logs/e2e_$f.log ) &
done
( export CUDA_VISIBLE_DEVICES=3
  timeout 230 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 900 \
      --compare-with benchmarks/results/families/after_2026-11-29c \
      --shapes qwen3-next-80b-slice,gemma-4-26b-a4b,deepseek-v3-slice > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --durations=15 \
      tests/kernels/test_moe_routing.py tests/kernels/test_moe_kernel.py tests/kernels/test_quant_moe_path.py \
      tests/kernels/test_quant_moe_kernels.py tests/layers/test_sandwich_norms.py \
      tests/gpu/test_gpu_moe_families.py tests/gpu/test_fp8_kv_cache_gpu.py -s > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log
  timeout 90 python3 benchmarks/scripts/diag_router_margins.py .e2e_models $OUT/router_margins.json \
      > $OUT/logs/margins.log 2>&1; echo "margins rc=$?" >> $OUT/logs/margins.log
) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
for f in fam tests margins e2e_deepseek e2e_qwen35 e2e_gemma; do
  echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | tail -n 16
done
