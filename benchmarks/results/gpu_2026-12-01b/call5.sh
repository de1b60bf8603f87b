#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-01b (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD): issue 43 item 7
# after the closed-batch rule's quantile (3f0790b): bench e2e, plain, n-gram and the standalone draft at batch 8
# and 32, temperatures 0 and 0.8, steady and closed batch; then call 4's closed batch of 32 with n-gram again.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs $OUT/e2e $OUT/cl
timeout 330 python3 -m outpace bench e2e --out $OUT/e2e --workdir .e2e --methods none ngram draft \
  --batch-sizes 8 32 > $OUT/logs/e2e.log 2>&1
echo "e2e rc=$?" >> $OUT/logs/e2e.log
timeout 60 python3 benchmarks/scripts/diag_closed_loop.py --model .e2e/tinypy --method ngram --num-steps 4 \
  --adaptive --streams 32 --requests 32 --max-tokens 128 --temperature 0.8 --device cuda --dtype bfloat16 \
  --out $OUT/cl/ngram_32.json > $OUT/logs/cl_ngram_32.log 2>&1
echo "rc=$?" >> $OUT/logs/cl_ngram_32.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/e2e.log | grep -E "^(none|ngram|draft) |method|rc=|Error" | tail -n 20
grep -v "^outpace" $OUT/logs/cl_ngram_32.log | tail -n 8
