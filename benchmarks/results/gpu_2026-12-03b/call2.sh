#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-03b (nvidia-h200): call 1's prefetch settings all lost or tied, so they were taken
# out; what is left of the change is the MLA attention and merge and Gemma's sandwich norm kernels under PDL. This
# call times the captured decode step of DeepSeek-V2-Lite and Gemma 4 at b1@512 and b8@512 with the commit before
# the session's changes (.snap_a, 393312f) and with this one (.snap), alternately, on one machine (step_ms.py).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
here=$PWD
for round in 1 2; do
  for snap in .snap_a .snap; do
    left=$((430 - SECONDS)); [ $left -gt 150 ] && left=150
    [ $left -gt 60 ] && (cd $snap && PYTHONPATH=. timeout $left python3 $here/.snap/step_ms.py "$snap" \
      deepseek-v2-lite gemma-4-26b-a4b 2>&1 | grep -E "^STEP|Error" >> $OUT/logs/step_ms.log)
  done
done
cp $OUT/logs/step_ms.log $OUT/
cat $OUT/logs/step_ms.log
