#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), side by side:
#   GPU 0: bench families (bf16) after the router matvec's few-token path and the one-warp route kernel, beside
#          call 1; then DeepSeek-V2-Lite in block FP8 (torch's GEMM now takes its padded K blocks);
#   GPU 1: bench e2e at batch 32 with held zero-draft steps (4423706): Qwen3.5 EAGLE3 and MTP, then the
#          DeepSeek-like MTP (gpu_2026-11-29d: 0.95-0.96x and 0.94x closed);
#   then both GPUs: all_reduce_timings.py (NCCL against torch's symmetric-memory all-reduces).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 290 \
      --compare-with call1_fam --shapes qwen3-next-80b-slice,deepseek-v3-slice,deepseek-v2-lite,gemma-4-26b-a4b \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log
  timeout $(( 440 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam8 --quantized fp8 --no-verify \
      --compare-with call1_fam --shapes deepseek-v2-lite > $OUT/logs/fam8.log 2>&1
  echo "fam8 rc=$?" >> $OUT/logs/fam8.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 250 python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 --methods none eagle3 mtp \
      --out $OUT/e2e_qwen35 --workdir .e2e_models > $OUT/logs/e2e_qwen35.log 2>&1
  echo "e2e qwen35 rc=$?" >> $OUT/logs/e2e_qwen35.log
  timeout $(( 440 - SECONDS )) python3 -m outpace bench e2e --family deepseek --batch-sizes 32 \
      --methods none mtp --out $OUT/e2e_deepseek --workdir .e2e_models > $OUT/logs/e2e_deepseek.log 2>&1
  echo "e2e deepseek rc=$?" >> $OUT/logs/e2e_deepseek.log ) &
wait
timeout $(( 560 - SECONDS )) python3 benchmarks/scripts/all_reduce_timings.py $OUT/ar 2 > $OUT/logs/ar.log 2>&1
echo "ar rc=$?" >> $OUT/logs/ar.log
for d in fam fam8 e2e_qwen35 e2e_deepseek ar; do cp $OUT/$d/*.json $OUT/logs/ 2>/dev/null; done
tar czf $OUT/logs.tgz -C $OUT logs
for f in fam fam8; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v Warn | tail -n 16; done
for f in e2e_qwen35 e2e_deepseek; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | tail -n 22; done
echo "== ar"; grep -v Warn $OUT/logs/ar.log | tail -6
