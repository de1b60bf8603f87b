#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01b (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD): batch-invariant
# mode on tinyds with the MLA's 16-row tiles and 64-row splits (the engine's cuda cases); where a closed batch
# of n-gram speculation at temperature 0.8 loses to plain decoding (issue 43 item 7): every step of one closed
# batch of 8 and of 32 requests (128 tokens each) on the widened zoo, plain and adaptive n-gram.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs $OUT/cl
timeout 150 python3 -m pytest -v -p no:cacheprovider tests/engine/test_batch_invariant_trees.py -k cuda \
  > $OUT/logs/tests.log 2>&1
echo "tests rc=$?" >> $OUT/logs/tests.log
timeout 120 python3 -c "
from pathlib import Path
import torch
from outpace.bench.e2e import widened_zoo
print(widened_zoo(Path('.e2e'), 'llama', False, torch.bfloat16))
" > $OUT/logs/widen.log 2>&1
echo "widen rc=$?" >> $OUT/logs/widen.log
for s in 8 32; do
  for m in none ngram; do
    extra=""; [ $m = ngram ] && extra="--num-steps 4 --adaptive"
    timeout 70 python3 benchmarks/scripts/diag_closed_loop.py --model .e2e/tinypy --method $m $extra \
      --streams $s --requests $s --max-tokens 128 --temperature 0.8 --device cuda --dtype bfloat16 \
      --out $OUT/cl/${m}_$s.json > $OUT/logs/cl_${m}_$s.log 2>&1
    echo "rc=$?" >> $OUT/logs/cl_${m}_$s.log
  done
done
tar czf $OUT/logs.tgz -C $OUT logs
grep -E "passed|failed|rc=" $OUT/logs/tests.log | tail -n 3
tail -n 1 $OUT/logs/widen.log
for f in $OUT/logs/cl_*.log; do echo "== $f"; grep -v "^outpace" $f | tail -n 6; done
