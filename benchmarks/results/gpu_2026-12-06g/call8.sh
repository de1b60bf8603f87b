#!/usr/bin/env bash
# After the prefill step's host-to-device copies stopped waiting on the GPU (outpace/host_copies.py): the GPU test
# that a prefill step waits once, then call 5's n-gram closed batches again (first step and totals against plain
# decoding), then the widened Llama's EAGLE3 chain (its first step).
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -x tests/gpu/test_gpu.py -k "waits or every_decode_step" -p no:cacheprovider \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=|assert" $OUT/pytest.log | tail -n 12
rounds() {  # label limit methods...
  local label=$1 limit=$2; shift 2
  timeout $limit python3 benchmarks/scripts/closed_batch_rounds.py --methods "$@" --batches 8 32 --temperatures 0 0.8 \
    --rounds 5 --max-tokens 128 --workdir /tmp/e2e_llama --out $OUT/$label.json --steps $OUT/steps_$label.json \
    > $OUT/$label.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$label.log
  sed -i -E 's/\r/\n/g' $OUT/$label.log
  grep -E "^(method|none|ngram|eagle3)|rc=|Error" $OUT/$label.log
}
rounds ngram $(( 420 - SECONDS )) ngram
python3 benchmarks/scripts/closed_batch_tail.py $OUT/steps_ngram.json
[ $SECONDS -lt 440 ] && rounds eagle3 $(( 585 - SECONDS )) eagle3
