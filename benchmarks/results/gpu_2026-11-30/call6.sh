#!/usr/bin/env bash
# Device call 6 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the hybrids' plain decoding with the
# per-step bound on run-ahead's saved state (MAX_SAVED_BYTES), beside call 2 (never ahead on hybrids) and
# gpu_2026-11-29f call 4 (always ahead). Copy call 2's fam/ and gpu_2026-11-29f's call4/famA, famB into .snap
# as call2_fam, call4_famA, call4_famB.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m outpace.bench.families --out $OUT/famA --no-verify --compare-with call2_fam call4_famB \
      --shapes qwen3.5,nemotron-h-8b > $OUT/logs/famA.log 2>&1
  echo "famA rc=$?" >> $OUT/logs/famA.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 330 python3 -m outpace.bench.families --out $OUT/famB --no-verify --compare-with call2_fam call4_famA \
      --shapes qwen3-next-80b-slice > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
for f in famA famB; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v -i "warn\|legend" | tail -n 9; done
