#!/usr/bin/env bash
# Device call 36 (issues 43 and 44): how fast a weight streams at batch 1 outside Triton. cuda_gemv_probe.py times
# the shipped few-row kernels, torch's F.linear and plain CUDA products (compiled here by nvcc) at the shapes
# whose kernels read far under the floor, each in a graph of 8 calls on distinct weights.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 benchmarks/scripts/cuda_gemv_probe.py $OUT/cuda_gemv_probe.json > $OUT/probe.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/probe.log
grep -v '^{' $OUT/probe.log | tail -n 14
