#!/usr/bin/env bash
# Device call 19 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# what call 18's limit cut: 04e01a4 (a greedy step's verdict from the target's head) under every zoo drafter's
# lossless GPU test and batch-invariant mode's GPU tests; the widened Qwen3.5's plain and MTP rows at batch 1
# (call 16: MTP 1.979x); then 271fd32's SwiGLU tiles inside the captured decode step of the Llama-3.1-8B and
# Qwen3.5 shapes (decode_settings.py; a tile is adopted only where the step is faster at b1 and b8).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 180 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_gpu.py \
  tests/gpu/test_batch_invariant_gpu.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out /tmp/out_q --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
rm -rf /tmp/e2e_q
for sweep in swiglu_llama swiglu_qwen35; do
  left=$((565 - SECONDS)); [ $left -gt 140 ] && left=140
  [ $left -gt 40 ] && timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/logs/$sweep.json $sweep \
    > $OUT/logs/$sweep.log 2>&1
  echo "rc=$?" >> $OUT/logs/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | grep -E "passed|failed|FAILED|rc=" | tail -n 8
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A5 "^method|rc=" | tail -n 7
for sweep in swiglu_llama swiglu_qwen35; do tar xzf $OUT/logs.tgz -O logs/$sweep.log | tail -n 5; done
