#!/usr/bin/env bash
# Issue 43 items 7 and 8 after the closed-batch rule's change (4ec704f), as gpu_2026-12-06c/next.sh planned them
# (n-gram left out: that session's call 4 ran it, five rounds). ARGS: llama (the Kimi-K2 slice's batch-invariant cost,
# then the widened Llama's EAGLE3 chain and tree, MTP, DFlash and the standalone draft), or family FAMILY METHOD...
# (qwen35 mtp, qwen35 eagle3-tree, deepseek eagle3, deepseek mtp, gemma eagle3: on an 80 GB H100 one method a call,
# README.md says why). Closed batches of 64 tokens at batch 8 and 32, temperature 0 and 0.8, three interleaved
# rounds. Each call under 590 s.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
rounds() {  # family label limit methods...
  local family=$1 label=$2 limit=$3; shift 3
  timeout $limit python3 benchmarks/scripts/closed_batch_rounds.py --family $family --methods "$@" --batches 8 32 \
    --temperatures 0 0.8 --rounds 3 --max-tokens 64 --workdir /tmp/e2e_$family --out $OUT/$label.json \
    --steps $OUT/steps_$label.json > $OUT/$label.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$label.log
}
if [ "$1" = llama ]; then
  timeout 150 python3 benchmarks/scripts/batch_invariant_speed.py --shapes kimi-k2-slice --contexts 512 \
    --out $OUT/kimi_invariant.json > $OUT/kimi_invariant.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/kimi_invariant.log
  rounds llama llama_a $(( 420 - SECONDS )) eagle3 eagle3-tree mtp
  rounds llama llama_b $(( 585 - SECONDS )) dflash draft
else  # family FAMILY METHOD...: the other widened models' folders cleared first (64 GB of disk)
  find /tmp -maxdepth 1 -name 'e2e_*' ! -name "e2e_$2" -exec rm -rf {} +
  rounds $2 $2 $(( 560 - SECONDS )) "${@:3}"
fi
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for log in $OUT/*.log; do echo "== $log"; grep -E "^(method|[a-z0-9-]+ +[0-9]+ +0\.[08] )|rc=|Error" $log; done
[ -f $OUT/kimi_invariant.log ] && tail -8 $OUT/kimi_invariant.log
