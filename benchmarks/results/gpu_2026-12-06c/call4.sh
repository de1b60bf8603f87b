#!/usr/bin/env bash
# 2026-12-06 (third session), call 4: the INT4 tile fix's GPU tests (call 3's three failures), then issue 43 item 7's
# first rows, adaptive n-gram on the widened Llama zoo in closed batches of 128 tokens (batch 8 and 32, temperature
# 0 and 0.8, five rounds), the chooser's closed-batch rule before (b1eede8's adaptive.py, written as call2.sh says) and after, as call 2.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=. timeout 150 python3 -m pytest -q -n 3 -p no:cacheprovider tests/kernels/test_int4_linear.py \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
rm -rf /tmp/before && mkdir /tmp/before && cp -r outpace benchmarks /tmp/before/
cp benchmarks/results/gpu_2026-12-06c/adaptive_b1eede8.py /tmp/before/outpace/speculative/adaptive.py
run() {  # tree label limit
  (cd $1 && PYTHONPATH=. timeout $3 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram \
    --batches 8 32 --temperatures 0 0.8 --rounds 5 --max-tokens 128 --workdir /tmp/e2e_llama \
    --out $OUT/ngram_$2.json --steps $OUT/ngram_steps_$2.json > $OUT/ngram_$2.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/ngram_$2.log)
}
run $PWD after 260
run /tmp/before before $(( 570 - SECONDS ))
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for label in after before; do echo "== $label"; grep -E "^(method|none|ngram)|rc=|Error" $OUT/ngram_$label.log; done
