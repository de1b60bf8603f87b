#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01b (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD): batch-invariant
# mode's cost (issue 43 item 8) on every family shape that fits one GPU, the first time since the fused MLA block
# serves the mode (0df0c65), and V2-Lite's decode step in the mode (timeline).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 60 python3 benchmarks/scripts/step_timeline.py $OUT/logs deepseek-v2-lite@1 --batch-invariant --lines 0 \
  > $OUT/logs/timeline.log 2>&1
echo "timeline rc=$?" >> $OUT/logs/timeline.log
timeout 450 python3 benchmarks/scripts/batch_invariant_speed.py --out $OUT/bi_families.json \
  --shapes deepseek-v2-lite,gemma-3-12b,qwen3.5,gemma-4-26b-a4b,qwen3-next-80b-slice,nemotron-h-8b,step-3.5-flash-slice,deepseek-v3-slice \
  > $OUT/logs/bi.log 2>&1
echo "bi rc=$?" >> $OUT/logs/bi.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -E "tokens/s|rc=|Error" $OUT/logs/bi.log | grep -v "%|" | tail -n 40
tail -n 3 $OUT/logs/timeline.log
