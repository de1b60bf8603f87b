#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side: bench families
# (bf16) after a plain projection's outputs a program stream as one sub-tile (fused_projection.py
# plain_sub_tile), beside calls 1 and 2; the fused projection's GPU tests.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 80 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      tests/layers/test_fused_projection.py tests/layers/test_gemma_fused.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log
  timeout $(( 330 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famA --no-verify --time-limit 240 \
      --compare-with call2_fam call1_fam --shapes qwen3-next-80b-slice,deepseek-v3-slice,step-3.5-flash-slice \
      > $OUT/logs/famA.log 2>&1
  echo "famA rc=$?" >> $OUT/logs/famA.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 330 python3 -m outpace.bench.families --out $OUT/famB --no-verify --time-limit 320 \
      --compare-with call2_fam --shapes deepseek-v2-lite,gemma-4-26b-a4b,kimi-k2-slice,qwen3.5,nemotron-h-8b \
      > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log ) &
wait
cp $OUT/famA/families.json $OUT/logs/familiesA.json 2>/dev/null; cp $OUT/famB/families.json $OUT/logs/familiesB.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; tail -n 4 $OUT/logs/tests.log
for f in famA famB; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v -i "warn\|legend" | tail -n 22; done
