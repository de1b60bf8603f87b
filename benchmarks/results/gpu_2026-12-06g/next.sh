#!/usr/bin/env bash
# For the next device (an H100 is enough, under 590 s): the waits a prefill step has left per drafter
# (prefill_waits.py, after the copies changed since call 9), n-gram's steps 0, 1 and 20 under the profiler against
# plain decoding's (where its first step's 0.7 / 1.7 ms more go), then call 8's n-gram closed batches again
# with the median of every round's first step.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
timeout 120 python3 benchmarks/scripts/prefill_waits.py > $OUT/prefill_waits.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/prefill_waits.log
grep -vE "Warning|warn" $OUT/prefill_waits.log
LIMIT=200 bash benchmarks/results/gpu_2026-12-06g/ngram_profile.sh
timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 \
  --temperatures 0 0.8 --rounds 5 --max-tokens 128 --workdir /tmp/e2e_llama --out $OUT/ngram.json \
  --steps $OUT/steps_ngram.json > $OUT/ngram.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/ngram.log
sed -i -E 's/\r/\n/g' $OUT/ngram.log
grep -E "^(method|none|ngram|  )|rc=|Error" $OUT/ngram.log
