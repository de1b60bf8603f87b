#!/usr/bin/env bash
# Device call 14 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# greedy drafts' tokens from the head in one launch (layers/fused_projection.py head_argmax, 5dd238b): its GPU
# tests and the zoo drafters' lossless GPU test, the widened Qwen3.5's MTP row at batch 1 (call 10: 1.97x,
# 499.6 against 253.9 tok/s) and its step's kernels (call 10's spans 4224.8 / 4344.0 / 4425.3 us), then the
# DeepSeek MTP row (call 8: 1.44x) as time allows.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/layers/test_head_argmax.py \
  "tests/gpu/test_gpu.py::test_zoo_drafters_lossless_fp32_on_gpu" > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp --out /tmp/out_q \
  --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
timeout 100 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 --workdir /tmp/e2e_q \
  > $OUT/logs/tl/verify_timeline.log 2>&1
rm -rf /tmp/e2e_q
left=$((575 - SECONDS))
if [ $left -gt 100 ]; then
  timeout $left python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp --out /tmp/out_d \
    --workdir /tmp/e2e_d > $OUT/logs/e2e_deepseek.log 2>&1
  echo "rc=$?" >> $OUT/logs/e2e_deepseek.log
  cp /tmp/out_d/*.json $OUT/logs/ 2>/dev/null
fi
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 3
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A6 "^method|rc=" | tail -n 7
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log | grep -E "kernel time"
tar xzf $OUT/logs.tgz -O logs/e2e_deepseek.log 2>/dev/null | grep -E -A6 "^method|rc=" | tail -n 7
