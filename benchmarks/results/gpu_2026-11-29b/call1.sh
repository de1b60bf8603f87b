#!/usr/bin/env bash
# Device call 1 of the session of 2026-11-29 (third), on nvidia-h200-x2: the two GPUs side by side.
# GPU 0: the fused MLA block's GPU tests (rotary tables now cover the 4000-token layouts), then the families
# bench over the MLA/MoE shapes; GPU 1: the families bench over the other shapes.
set -u  # runs from .snap/: a git archive of HEAD (helpers edit the working tree meanwhile)
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,memory.total --format=csv
(
  CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -q -p no:cacheprovider --tb=line -rf \
      tests/kernels/test_mla_fused.py > $OUT/logs/mla.log 2>&1; echo "mla rc=$?" >> $OUT/logs/mla.log
  CUDA_VISIBLE_DEVICES=0 timeout 360 python3 -m outpace.bench.families --out $OUT/fam0 --time-limit 330 \
      --shapes deepseek-v2-lite,deepseek-v3-slice,kimi-k2-slice,qwen3-next-80b-slice > $OUT/logs/fam0.log 2>&1
  echo "fam0 rc=$?" >> $OUT/logs/fam0.log
) &
(
  CUDA_VISIBLE_DEVICES=1 timeout 520 python3 -m outpace.bench.families --out $OUT/fam1 --time-limit 480 \
      --shapes qwen3.5,nemotron-h-8b,gemma-3-12b,gemma-4-26b-a4b,step-3.5-flash-slice > $OUT/logs/fam1.log 2>&1
  echo "fam1 rc=$?" >> $OUT/logs/fam1.log
) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
grep -h "FAILED\|passed\|failed\|rc=" $OUT/logs/mla.log | head -30
tail -n 25 $OUT/logs/fam0.log; tail -n 30 $OUT/logs/fam1.log
