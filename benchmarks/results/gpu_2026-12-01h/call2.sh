#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01h (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the start-up warm-up over every Triton length class (63ca15b): diag_first_use.py's family mode on DeepSeek's zoo
# MTP engine, then bench e2e's DeepSeek MTP row at batch 1 (its closed batch); then step timelines at batch 1
# without programmatic dependent launch (each kernel's own time) of the Qwen3-Next slice and DeepSeek-V2-Lite.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 150 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp > $OUT/logs/diag_zoo.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_zoo.log
timeout $(( 420 - SECONDS )) python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e --workdir /tmp/e2e_ds > $OUT/logs/e2e.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e.log
OUTPACE_PDL=0 timeout $(( 540 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs \
  qwen3-next-80b-slice@1 deepseek-v2-lite@1 --lines 0 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== diag"; grep -E "^(timed|warm-up|  step)" $OUT/logs/diag_zoo.log | cut -c1-300
echo "== e2e"; grep -E -A6 "^method|rc=" $OUT/logs/e2e.log | tail -n 14
echo "== tl"; grep -E "kernels|span|rc=|Error" $OUT/logs/tl.log $OUT/logs/timeline_* | tail -n 6
