#!/usr/bin/env bash
# For the next session with a device (written 2026-12-06, not yet run): issue 43 item 7 after the closed-batch
# rule's change (the expected largest of the requests' step counts, 2026-12-06): every drafter against plain decoding
# in closed batches of 64 tokens at batch 8 and 32, temperature 0 and 0.8, three interleaved rounds, on the widened
# Llama zoo (EAGLE3 chain and tree, MTP, DFlash, the standalone draft, and n-gram again, three rounds against call 4's
# five) and the widened families (Qwen3.5: MTP and the EAGLE3 tree; DeepSeek: EAGLE3 and MTP; Gemma: EAGLE3). ARG: llama or
# families (one call each, about 550 s on a fresh machine).
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
  rounds llama llama_a 280 eagle3 eagle3-tree mtp
  rounds llama llama_b $(( 570 - SECONDS )) dflash draft ngram
else
  rounds qwen35 qwen35 200 mtp eagle3-tree
  rounds deepseek deepseek 200 eagle3 mtp
  rounds gemma gemma $(( 570 - SECONDS )) eagle3
fi
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for log in $OUT/*.log; do echo "== $log"; grep -E "^(method|[a-z0-9-]+ +[0-9]+ +0\.[08] )|rc=|Error" $log; done
