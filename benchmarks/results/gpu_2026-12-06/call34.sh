#!/usr/bin/env bash
# Device call 34 (for the next session with a device; issue 43 item 7): where Qwen3.5's EAGLE3 closed batch at
# batch 32, temperature 0.8 loses its 3-7% to plain decoding (calls 31-33: 0.93x-0.97x closed, 0.99x-1.03x steady):
# every engine step of each row's last round (wall ms, rows, the shape chosen: closed_batch_rounds.py --steps),
# at 64 and 128 tokens. First the held-step GPU tests that call 29 cut at 60 s on a fresh machine. The limits
# allow for a fresh machine (the widening and the first compilations take minutes there).
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/speculative/test_pending_window.py \
  tests/speculative/test_zero_draft_hold.py -k "pending or held or hold" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
tail -n 3 $OUT/pytest.log
for tokens in 64 128; do
  timeout 170 python3 benchmarks/scripts/closed_batch_rounds.py --family qwen35 --methods eagle3 --batches 32 \
    --temperatures 0.8 --rounds 3 --max-tokens $tokens --workdir /tmp/e2e_qwen35 --out $OUT/rounds_$tokens.json \
    --steps $OUT/steps_$tokens.json > $OUT/rounds_$tokens.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/rounds_$tokens.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for log in $OUT/rounds_*.log; do echo "== $log"; tail -n 6 $log; done
