#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): issue 46 continued from call 1's
# multi_gpu.json (prev46/, with item1's random-qwen3-next MTP row taken out of "done" so that it runs again
# with plain decoding's top-2 log-prob gap at the first difference), then item 3 (qwen3next80b) and item 2
# (ep) as far as the time limit goes; the same command continues it.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs $OUT/multi46 && cp prev46/multi_gpu.json $OUT/multi46/
MULTI_TIME_LIMIT=550 timeout 585 bash benchmarks/scripts/gpu_run.sh $OUT/multi46 multi item1,qwen3next80b,ep \
    > $OUT/logs/multi.log 2>&1; echo "multi rc=$?" >> $OUT/logs/multi.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | tail -n 60
