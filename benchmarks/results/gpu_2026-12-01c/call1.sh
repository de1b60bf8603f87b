#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01c (nvidia-h200, one GPU): issue 43 item 7 decided with repeated runs.
# .snap: a git archive of HEAD (today's closed-batch rule); a copy of it with .snapB/adaptive.py, 74f9029's (the
# closed-batch quantile where the requests share one rate). closed_batch_rounds.py: none / ngram / draft at
# batch 8 and 32, temperature 0 and 0.8, 5 interleaved rounds, medians. Then diag_closed_loop.py's per-step
# records of one closed batch of 32 (T 0.8, 128 tokens) for plain and n-gram (today's rule), to find the
# zero-draft n-gram cost.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
cd .snap; S=$(pwd)
PYTHONPATH=. timeout 200 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram draft --batches 8 32 \
  --rounds 5 --workdir .e2e --out $OUT/rounds_today.json > $OUT/logs/rounds_today.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds_today.log
B=$(mktemp -d) && cp -r outpace benchmarks $B/ && ln -s $S/.e2e $B/.e2e && ln -s $S/zoo $B/zoo
cp ../.snapB/adaptive.py $B/outpace/speculative/adaptive.py && cd $B
PYTHONPATH=. timeout 150 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram draft --batches 8 32 \
  --rounds 5 --workdir .e2e --out $OUT/rounds_quantile.json > $OUT/logs/rounds_quantile.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds_quantile.log
cd $S
for m in none ngram; do
  extra=""; [ $m = ngram ] && extra="--num-steps 4 --adaptive"
  PYTHONPATH=. timeout 60 python3 benchmarks/scripts/diag_closed_loop.py --model .e2e/tinypy --method $m $extra \
    --streams 32 --requests 32 --max-tokens 128 --temperature 0.8 --seed 0 --device cuda --dtype bfloat16 \
    --out $OUT/diag_$m.json > $OUT/logs/diag_$m.log 2>&1
  echo "rc=$?" >> $OUT/logs/diag_$m.log
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
cd $OUT && tar xzf logs.tgz && for f in logs/rounds_today.log logs/rounds_quantile.log; do echo "== $f"; grep -v "%|" $f | tail -n 14; done
for f in logs/diag_*.log; do echo "== $f"; tail -n 8 $f; done; rm -rf logs
