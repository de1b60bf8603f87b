#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD 16da031), one GPU each, side by side:
#   GPU 0: batch-invariant mode's cost on Gemma-3-12B at 512 / 256 / 128 KV rows a split (after fc82220 /
#          e8f6283: a split walked by few programs; untimed until now).
#   GPU 1: tests/engine/test_batch_invariant_trees.py's cuda cases (never passed on a GPU), the mode's cost on
#          DeepSeek-V2-Lite at 512 / 128 rows, then the V2-Lite batch-1 step timeline (ModelRunner.profile
#          through padding_replays, untried on a GPU since 16da031).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 benchmarks/scripts/batch_invariant_speed.py --shapes gemma-3-12b \
      --split-rows 512 256 128 --out $OUT/logs/binvG.json > $OUT/logs/binvG.log 2>&1
  echo "binvG rc=$?" >> $OUT/logs/binvG.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 -m pytest -q tests/engine/test_batch_invariant_trees.py > $OUT/logs/t_trees.log 2>&1
  echo "t_trees rc=$?" >> $OUT/logs/t_trees.log
  timeout $(( 430 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py --shapes deepseek-v2-lite \
      --split-rows 512 128 --out $OUT/logs/binvD.json > $OUT/logs/binvD.log 2>&1
  echo "binvD rc=$?" >> $OUT/logs/binvD.log
  timeout $(( 530 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl deepseek-v2-lite@1 \
      --lines 0 > $OUT/logs/tl.log 2>&1
  echo "tl rc=$?" >> $OUT/logs/tl.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_trees"; grep -E "passed|failed|error|rc=" $OUT/logs/t_trees.log | tail -n 4
for f in binvG binvD; do echo "== $f"; grep -E "tokens/s" $OUT/logs/$f.log | tail -n 12; grep -E "Error|rc=" $OUT/logs/$f.log | tail -3; done
echo "== tl"; grep -E "kernels and|span|Error|rc=" $OUT/logs/tl.log | tail -n 4
