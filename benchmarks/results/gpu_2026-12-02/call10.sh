#!/usr/bin/env bash
# Device call 10 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# gated DeltaNet's step kernel with fewer barriers a token (layers/deltanet_step_kernel.py, c2d4a2c):
# its GPU tests, the widened Qwen3.5's MTP row at batch 1 and its step's kernels, then bench families of
# Qwen3.5 and the Qwen3-Next slice (the same kernel in their linear-attention layers).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/kernels/test_deltanet_step.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp --out /tmp/out_q \
  --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
timeout 100 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 --workdir /tmp/e2e_q \
  > $OUT/logs/tl/verify_timeline.log 2>&1
rm -rf /tmp/e2e_q
timeout $(( 590 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --time-limit $(( 580 - SECONDS )) --shapes qwen3.5,qwen3-next-80b-slice > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 3
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A6 "^method|rc=" | tail -n 7
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log | grep -E "kernel time"
tar xzf $OUT/logs.tgz -O logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 10
