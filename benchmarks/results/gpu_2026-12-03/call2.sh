#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-03 (nvidia-h200): call 1's two failures. (1) The hybrids' EAGLE3-tree greedy tokens
# one short on the GPU: hybrid_tree_bisect.py under switches on this commit (.snap), and its default case on
# c1be7e4 (.snap_a, 2026-12-01 23:10) and 276048f (.snap_b, 2026-12-01 13:33). (2) GPU memory left after the
# family bench's engines closed: memory_after_close.py, then test_family_shapes.py alone.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
here=$PWD
(cd .snap && PYTHONPATH=. timeout 200 python3 $here/.snap/hybrid_tree_bisect.py qwen3_next default chain no_run_ahead \
  eager no_prefix_cache unchunked torch_attention no_fused_step no_greedy_head no_fused_rows) > $OUT/logs/bisect.log 2>&1
(cd .snap && PYTHONPATH=. timeout 60 python3 $here/.snap/hybrid_tree_bisect.py nemotron_h default no_fused_step \
  no_greedy_head) >> $OUT/logs/bisect.log 2>&1
for old in .snap_a .snap_b; do
  (cd $old && PYTHONPATH=. timeout 60 python3 $here/.snap/hybrid_tree_bisect.py qwen3_next default) 2>&1 \
    | sed "s/^RESULT/RESULT $old/" >> $OUT/logs/bisect.log
done
(cd .snap && PYTHONPATH=. timeout 90 python3 $here/.snap/memory_after_close.py deepseek-v2-lite) > $OUT/logs/memory.log 2>&1
(cd .snap && PYTHONPATH=. timeout $(( 560 - SECONDS )) python3 -m pytest -q -p no:cacheprovider --tb=line -m gpu \
  tests/bench/test_family_shapes.py -k "v2-lite or gemma-3 or qwen3.5") >> $OUT/logs/memory.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
cp $OUT/logs/*.log $OUT/
grep -E "RESULT|Error|error" $OUT/logs/bisect.log | tail -n 25
grep -E "MEM|passed|failed|Error" $OUT/logs/memory.log | tail -n 40
