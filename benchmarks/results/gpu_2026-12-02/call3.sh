#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# MTP's window update in one launch (PendingRows.take_verified): its GPU tests and the MTP GPU tests, then the
# widened Qwen3.5's MTP row at batch 1 and its step kernel by kernel (call 2 had the update's torch kernels).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 150 python3 -m pytest -q -x tests/speculative/test_pending_window.py tests/gpu/test_batch_invariant_hybrids_gpu.py \
  "tests/gpu/test_gpu.py::test_zoo_drafters_lossless_fp32_on_gpu" -k "mtp or pending" > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out /tmp/out_q35 --workdir /tmp/e2e_q35 > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q35/*.json $OUT/logs/ 2>/dev/null
mkdir -p $OUT/logs/tl
timeout $(( 400 - SECONDS )) python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 \
  --workdir /tmp/e2e_q35 > $OUT/logs/tl/verify_timeline.log 2>&1
echo "rc=$?" >> $OUT/logs/tl/verify_timeline.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 4
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A6 "^method|rc=" | tail -n 7
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log | grep -E "kernel time|rc="
