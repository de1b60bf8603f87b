#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side, after the
# absorbed MLA's per-head products in one launch in batch-invariant mode:
#   GPU 0: the skinny kernel's tests, the new MLA + MoE batch-invariant GPU test; the mode's cost on
#          DeepSeek-V2-Lite at 512 (shipped) and 128 KV rows a split.
#   GPU 1: the mode's cost on Gemma-3-12B at 512 and 128 KV rows a split.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 90 python3 -m pytest -q tests/kernels/test_skinny_gemm.py > $OUT/logs/t_skinny.log 2>&1
  echo "t_skinny rc=$?" >> $OUT/logs/t_skinny.log
  timeout 90 python3 -m pytest -q tests/gpu/test_batch_invariant_mla_moe_gpu.py > $OUT/logs/t_bi_ds.log 2>&1
  echo "t_bi_ds rc=$?" >> $OUT/logs/t_bi_ds.log
  timeout $(( 320 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py --shapes deepseek-v2-lite \
      --split-rows 512 128 --out $OUT/logs/binvA.json > $OUT/logs/binvA.log 2>&1
  echo "binvA rc=$?" >> $OUT/logs/binvA.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 320 python3 benchmarks/scripts/batch_invariant_speed.py --shapes gemma-3-12b \
      --split-rows 512 128 --out $OUT/logs/binvB.json > $OUT/logs/binvB.log 2>&1
  echo "binvB rc=$?" >> $OUT/logs/binvB.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_skinny t_bi_ds; do echo "== $n"; grep -E "passed|failed|error|rc=" $OUT/logs/$n.log | tail -n 3; done
for f in binvA binvB; do echo "== $f"; grep -E "tokens/s" $OUT/logs/$f.log | tail -n 12; grep -E "Error|rc=" $OUT/logs/$f.log | tail -3; done
