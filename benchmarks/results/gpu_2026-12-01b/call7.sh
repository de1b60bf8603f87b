#!/usr/bin/env bash
# Device call 7 of gpu_2026-12-01b (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD): today's baseline
# for issue 43 item 7 after the closed-batch quantile's revert: bench e2e, plain and n-gram at batch 8 and 32,
# temperatures 0 and 0.8, steady and closed batch.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs $OUT/e2e
timeout 220 python3 -m outpace bench e2e --out $OUT/e2e --workdir .e2e --methods none ngram \
  --batch-sizes 8 32 > $OUT/logs/e2e.log 2>&1
echo "e2e rc=$?" >> $OUT/logs/e2e.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/e2e.log | grep -E "^(none|ngram) |method|rc=|Error" | tail -n 12
