#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-01f (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# the session's last: the captured zoo decode and its drafters with a request that surely ends kept out of the
# step run ahead (3627c49); where n-gram's first step of a closed batch of 32 at temperature 0.8 spends the
# 7-9 ms it takes beyond plain decoding's (calls 1 and 2), under torch.profiler; V2-Lite's decode step timeline
# on the fused stack.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 140 python3 -m pytest $T tests/gpu/test_gpu.py -k "not eager" > $OUT/logs/t_gpu.log 2>&1
echo "rc=$?" >> $OUT/logs/t_gpu.log
timeout 120 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 32 --temperatures 0.8 \
  --rounds 2 --workdir /tmp/e2e --steps $OUT/steps.json --profile-first > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
timeout $(( 320 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs deepseek-v2-lite@1 --lines 0 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_gpu"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_gpu.log | tail -n 8
echo "== rounds"; grep -vE "%\||widening" $OUT/logs/rounds.log | grep -E "^ngram|^none|rc=" | tail -n 6
echo "== tl"; grep -E "kernels|span|rc=|Error" $OUT/logs/timeline_* $OUT/logs/tl.log 2>/dev/null | tail -n 4
