#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-03d (nvidia-h200), with the session's last ~460 s: where batch-invariant mode's
# cost on the Qwen3-Next slice goes (call 3: -27.8% at batch 1, 0.99 against 0.72 ms a step). The captured batch-1
# step's kernels in the mode and on the normal path, without PDL (each kernel's own time).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
for mode in --batch-invariant ""; do
  OUTPACE_PDL=0 timeout 150 python3 benchmarks/scripts/step_timeline.py $OUT qwen3-next-80b-slice@1 $mode \
    --lines 0 > /dev/null 2>&1
done
# (names with '@' do not come back from the device: the rerun of this call renamed them first)
for f in $OUT/timeline_*.txt; do mv "$f" "${f//@/_b}"; done; gzip -9 $OUT/timeline_*.txt
ls -la $OUT
