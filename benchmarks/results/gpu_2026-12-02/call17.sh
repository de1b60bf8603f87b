#!/usr/bin/env bash
# Device call 17 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# NOT RUN this session (its device time was spent): 85692a8 (chain steps' positions from the uniform metadata's
# launch, a chain's parents and depths kept as views of one tensor) on the GPU: the uniform metadata's kernel
# test, then tests/gpu/test_gpu.py (every zoo drafter lossless in fp32 with graphs, captured steps), then the
# widened Qwen3.5's MTP and EAGLE3 rows at batch 1 (call 16: 1.979x, 3.05x) and the MTP step's kernels (call 16:
# 220 kernels and copies, spans 4154.6 / 4287.1 / 4377.0 us).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
  "tests/kernels/test_triton_attention.py::test_uniform_metadata_fields" tests/gpu/test_gpu.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 200 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp eagle3 \
  --out /tmp/out_q --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
left=$((560 - SECONDS))
[ $left -gt 40 ] && timeout $left python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 \
  --workdir /tmp/e2e_q > $OUT/logs/tl/verify_timeline.log 2>&1
rm -rf /tmp/e2e_q
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 4
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A8 "^method|rc=" | tail -n 9
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log 2>/dev/null | grep -E "kernel time"
