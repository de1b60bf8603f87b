#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-01j (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# NOT RUN this session (no device time left): the chooser's lock-in changes (a deferred probe waits one spacing at
# most, a lone request within the binomial noise of the batch-wide rate takes it) on the rows they are for: the
# widened DeepSeek's and Qwen3.5's MTP rows at batch 1 (temperature 0.8 fell to 1.06x on DeepSeek in call 4), and
# n-gram's closed batches at 0.8 (0.997x / 0.998x in call 3), which they should leave as they were.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 230 python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_ds --workdir /tmp/e2e_ds > $OUT/logs/e2e_ds.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_ds.log
timeout 180 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_q35 --workdir /tmp/e2e_q35 > $OUT/logs/e2e_q35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_q35.log
timeout $(( 580 - SECONDS )) python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 \
  --temperatures 0.8 --rounds 5 --workdir /tmp/e2e --out $OUT/rounds.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
cp $OUT/e2e_ds/*.json $OUT/e2e_q35/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
for f in e2e_ds e2e_q35; do grep -E -A6 "^method|rc=" $OUT/logs/$f.log | tail -n 7; done
grep -vE "it/s|s/it|tensor/s|widening" $OUT/logs/rounds.log | tail -n 6
