#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD). Side by side, one GPU each:
#   GPU 0: where MTP speculation leaves plain decoding on the random Qwen3-Next target (call 2: one sequence
#          differed at TP = 2 with plain's top-2 gap 0.17), bisected at TP = 1
#          (benchmarks/scripts/diag_hybrid_mtp_lossless.py); then issue 44's Qwen3-Next-80B-A3B whole in
#          block FP8 on one H200 with its MTP layer (ORACLE acceptance);
#   GPU 1: issue 43's families bench again over the shapes not measured since this week's fixes (bf16), then
#          the DeepSeek-V3 / Kimi-K2 slices with INT4 experts beside bf16.
# Then on both GPUs: issue 45's captured-iteration check under expert parallelism (tests/gpu/
# test_gpu_expert_parallel.py).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
B=benchmarks/results/families/after_call2_fam0
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 benchmarks/scripts/diag_hybrid_mtp_lossless.py .e2e_models $OUT/diag_mtp.json \
      > $OUT/logs/diag.log 2>&1; echo "diag rc=$?" >> $OUT/logs/diag.log
  timeout 200 python3 -m outpace.bench.families --out $OUT/fp8 --quantized fp8 --no-verify \
      --shapes qwen3-next-80b --time-limit 440 > $OUT/logs/fp8.log 2>&1; echo "fp8 rc=$?" >> $OUT/logs/fp8.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 290 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 900 \
      --shapes qwen3-next-80b-slice,step-3.5-flash-slice,deepseek-v2-lite,gemma-4-26b-a4b,gemma-3-12b \
      > $OUT/logs/fam.log 2>&1; echo "fam rc=$?" >> $OUT/logs/fam.log
  timeout 110 python3 -m outpace.bench.families --out $OUT/int4 --quantized int4 --no-verify --time-limit 320 \
      --compare-with $B > $OUT/logs/int4.log 2>&1; echo "int4 rc=$?" >> $OUT/logs/int4.log
) &
wait
timeout 170 python3 -m pytest -v -p no:cacheprovider --tb=short -rf --durations=0 tests/gpu/test_gpu_expert_parallel.py \
    > $OUT/logs/ep_tests.log 2>&1; echo "ep tests rc=$?" >> $OUT/logs/ep_tests.log
tar czf $OUT/logs.tgz -C $OUT logs
for f in diag fp8 fam int4 ep_tests; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | tail -n 22; done
