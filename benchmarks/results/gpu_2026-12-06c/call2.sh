#!/usr/bin/env bash
# Issue 43 item 7 (2026-12-06, third session): closed batches of the widened Qwen3.5 with adaptive EAGLE3, the
# chooser's closed-batch rule before (b1eede8: each request's steps at the unluckiest quantile) and after (the
# expected largest of the requests' step counts), 64 tokens, batch 8 and 32, temperature 0 and 0.8, five rounds.
# The before copy is this tree with b1eede8's speculative/adaptive.py, written untracked before the call (the tree
# travels with its untracked files): git show b1eede8:outpace/speculative/adaptive.py > $(dirname $0)/adaptive_b1eede8.py
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/before && mkdir /tmp/before && cp -r outpace benchmarks /tmp/before/
cp benchmarks/results/gpu_2026-12-06c/adaptive_b1eede8.py /tmp/before/outpace/speculative/adaptive.py
run() {  # tree label limit
  (cd $1 && PYTHONPATH=. timeout $3 python3 benchmarks/scripts/closed_batch_rounds.py --family qwen35 \
    --methods eagle3 --batches 8 32 --temperatures 0 0.8 --rounds 5 --max-tokens 64 --workdir /tmp/e2e_qwen35 \
    --out $OUT/rounds_$2.json --steps $OUT/steps_$2.json > $OUT/rounds_$2.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/rounds_$2.log)
}
run $PWD after 300
run /tmp/before before $(( 570 - SECONDS ))
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for label in after before; do echo "== $label"; grep -E "^(method|none|eagle3)|rc=|Error" $OUT/rounds_$label.log; done
