#!/usr/bin/env bash
# The host repeats' change (the commit after .snap_a's tree: numpy's repeat for torch's CPU repeat_interleave) in
# closed batches: plain decoding and n-gram at batch 8 and 32, temperatures 0 and 0.8, 64 tokens, 6 rounds, every
# round's first step kept; the tree before (.snap_a, carried) and after, one after the other. Under 560 s.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
run() {  # $1: the tree's directory, $2: the output's name
  (cd $1 && PYTHONPATH=. timeout ${EACH:-260} python3 $OLDPWD/benchmarks/scripts/closed_batch_rounds.py --methods ngram \
    --batches 8 32 --temperatures 0 0.8 --rounds 6 --max-tokens 64 --workdir /tmp/e2e_llama \
    --out $OUT/$2.json --steps $OUT/$2_steps.json > $OUT/$2.log 2>&1; echo "rc=$? after ${SECONDS}s" >> $OUT/$2.log)
  sed -i -E 's/\r/\n/g' $OUT/$2.log
  echo "== $2"; grep -E "^(method|none|ngram|  )|rc=|Error" $OUT/$2.log
}
run .snap_a before
run . after
python3 - <<'PY'
import json, os
for name in ("before", "after"):
    rows = json.load(open(os.path.join(os.environ["OUT"], name + ".json")))["rows"]
    for r in rows:
        f = r["first_ms"]
        print(f"{name:<6} {r['method']:<6} b{r['batch']:<3} t{r['temperature']}: first step ms median {r['first_ms_median']:.2f}"
              f" max {max(f):.2f}  all {' '.join(f'{x:.1f}' for x in f)}")
PY
