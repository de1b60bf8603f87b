#!/usr/bin/env bash
# Where a closed batch's first step (the prompts' prefill) loses 10-25 ms now and then at batch 32 (gpu_2026-12-06g:
# 22-52 ms over five rounds, the slow rounds the slow closed batches): step 0 of every round under torch.profiler,
# the tables by the host's own time, plain decoding and n-gram, batch 32, temperatures 0 and 0.8. Under 300 s.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
timeout ${LIMIT:-280} python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 32 \
  --temperatures 0 0.8 --rounds 6 --max-tokens 64 --workdir /tmp/e2e_llama --out $OUT/first_steps.json \
  --steps $OUT/first_steps_steps.json --profile-steps 0 --profile-every-round \
  --profile-sort self_cpu_time_total > $OUT/first_steps.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/first_steps.log
sed -i -E 's/\r/\n/g' $OUT/first_steps.log
grep -E "under torch.profiler|^(method|none|ngram|  )|rc=|Error|Self CPU time total" $OUT/first_steps.log
