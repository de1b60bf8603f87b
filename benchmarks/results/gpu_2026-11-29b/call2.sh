#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD). GPU 0: the fused MLA block's engine
# test, then the families bench of the MLA shapes with the fused block on and the Gemma 4 shape (512-wide
# heads fixed); GPU 1: each family's batch-1 decode step by kernel name (benchmarks/scripts/family_kernels.py).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
(
  CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      tests/kernels/test_mla_fused.py -k engine > $OUT/logs/mla.log 2>&1; echo "mla rc=$?" >> $OUT/logs/mla.log
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m outpace.bench.families --out $OUT/fam0 --time-limit 300 \
      --shapes deepseek-v2-lite,deepseek-v3-slice,kimi-k2-slice,gemma-4-26b-a4b > $OUT/logs/fam0.log 2>&1
  echo "fam0 rc=$?" >> $OUT/logs/fam0.log
) &
(
  CUDA_VISIBLE_DEVICES=1 timeout 420 python3 benchmarks/scripts/family_kernels.py $OUT/kernels qwen3.5 \
      qwen3-next-80b-slice nemotron-h-8b deepseek-v2-lite step-3.5-flash-slice gemma-3-12b > $OUT/logs/kern.log 2>&1
  echo "kern rc=$?" >> $OUT/logs/kern.log
) &
wait
tar czf $OUT/logs.tgz -C $OUT logs kernels
grep -h "FAILED\|passed\|failed\|rc=\|Error" $OUT/logs/mla.log | head -30
grep -v "%|" $OUT/logs/fam0.log | tail -n 22
