#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirty-eighth). Each under 590 s.
# ARG: timeline: issue 43's three MoE shapes furthest from the floor at batch 1 (DeepSeek-V2-Lite 52.7%, Gemma 4
#      26B-A4B 56.5%, the Qwen3-Next slice 57.0% on the H200), one captured decode step kernel by kernel
#      (step_timeline.py): without programmatic dependent launch (OUTPACE_PDL=0: each kernel's own time), then as
#      served (with it: the gaps left between kernels); the files gzipped, the tables' tails printed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/t
nvidia-smi --query-gpu=name --format=csv,noheader
SHAPES="deepseek-v2-lite@1 gemma-4-26b-a4b@1 qwen3-next-80b-slice@1"
case "$1" in
timeline)
  OUTPACE_PDL=0 timeout 280 python3 benchmarks/scripts/step_timeline.py $OUT/t/nopdl $SHAPES --lines 0 \
    > $OUT/nopdl.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/nopdl.log
  timeout $(( 580 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/t/pdl $SHAPES --lines 0 \
    > $OUT/pdl.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/pdl.log
  sed -i -E 's/\r/\n/g' $OUT/*.log
  sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
  for f in $OUT/t/*/*; do gzip -c "$f" > $OUT/$(basename $(dirname "$f"))_$(basename "$f").gz; done
  rm -rf $OUT/t
  grep -hvi "warn" $OUT/nopdl.log $OUT/pdl.log | grep -vE "^\s*$" | tail -n 20
  ;;
esac
