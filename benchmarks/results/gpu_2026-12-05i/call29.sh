#!/usr/bin/env bash
# Device call 29 (issue 43 item 7): Qwen3.5's EAGLE3 at batch 32, temperature 0.8 (0.99x steady, 0.97x closed in
# gpu_2026-12-05h call 27, one closed batch each), before (.snap_a: the package at bcae089, a held step running
# fc and seven launches to append its row) and after (this commit: the pending windows keep the target's aux
# states, fc fuses them in the draft-extend; the append is one launch). Closed batches repeated five times,
# interleaved with plain decoding (closed_batch_rounds.py: medians). (Cut to fit the device time left: bench e2e
# after, and gpu_2026-12-05h's call 28.)
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# the held rows' append kernel against the torch form; held and narrow EAGLE3 / MTP steps captured, lossless
PYTHONPATH=. timeout 60 python3 -m pytest -q -p no:cacheprovider -n 4 tests/speculative/test_pending_window.py \
  tests/speculative/test_zero_draft_hold.py -k "pending or held or hold" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
tail -n 3 $OUT/pytest.log
rounds="benchmarks/scripts/closed_batch_rounds.py --family qwen35 --methods eagle3 --batches 32 --temperatures 0.8
  --rounds 5 --max-tokens 64 --workdir /tmp/e2e_qwen35"
PYTHONPATH=.snap_a timeout 130 python3 $rounds --out $OUT/rounds_before.json > $OUT/rounds_before.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/rounds_before.log
PYTHONPATH=. timeout 110 python3 $rounds --out $OUT/rounds_after.json > $OUT/rounds_after.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/rounds_after.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for log in $OUT/rounds_*.log; do echo "== $log"; tail -n 6 $log; done
