#!/usr/bin/env bash
# Device call 18 of gpu_2026-12-02 (nvidia-h200), the session's one call left (about 280 s of device time), from
# .snap/ (a git archive of the commit holding this script): 04e01a4 (a greedy step's verdict from the target's
# head in one launch) under the GPU tests: the head's argmax against its logits (tests/layers/test_head_argmax.py),
# every zoo drafter lossless in fp32 with graphs (tests/gpu/test_gpu.py), batch-invariant mode's bit-identical
# greedy outputs; then, in the time left, the widened Qwen3.5's MTP row at batch 1 (call 16: 1.979x).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/layers/test_head_argmax.py \
  tests/gpu/test_gpu.py tests/gpu/test_batch_invariant_gpu.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
left=$((265 - SECONDS))
[ $left -gt 60 ] && timeout $left python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 \
  --methods none mtp --out /tmp/out_q --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | grep -E "passed|failed|FAILED|rc=" | tail -n 8
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A5 "^method|rc=" | tail -n 7
