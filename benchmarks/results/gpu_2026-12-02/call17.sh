#!/usr/bin/env bash
# Device call 17 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# 85692a8 (chain steps' positions from the uniform metadata's launch, a chain's parents and depths kept as views of
# one tensor) on the GPU: the uniform metadata's kernel test and tests/gpu/test_gpu.py (every zoo drafter lossless
# in fp32 with graphs, captured steps); then where a verified token past the first goes: the Qwen3.5 shape's
# verify step at t = 1, 2, 3 without PDL (each kernel's own time; with PDL a kernel's span holds its wait), and
# the few-row projections at 1 .. 16 rows (projection_rows.py).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl $OUT/logs/tl_pdl
timeout 190 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
  "tests/kernels/test_triton_attention.py::test_uniform_metadata_fields" tests/gpu/test_gpu.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 130 python3 benchmarks/scripts/projection_rows.py $OUT/logs/rows.json > $OUT/logs/rows.log 2>&1
echo "rc=$?" >> $OUT/logs/rows.log
OUTPACE_PDL=0 timeout 120 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl qwen3.5@1 \
  > $OUT/logs/tl/verify_timeline.log 2>&1
left=$((560 - SECONDS))
[ $left -gt 60 ] && timeout $left python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl_pdl qwen3.5@1 \
  > $OUT/logs/tl_pdl/verify_timeline.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl*/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl*/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 4
tar xzf $OUT/logs.tgz -O logs/rows.log | grep -E "m=|rc=" | tail -n 45
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log 2>/dev/null | head -n 14
tar xzf $OUT/logs.tgz -O logs/tl_pdl/verify_timeline.log 2>/dev/null | head -n 3
