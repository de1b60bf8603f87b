#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01c (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD):
# - GPU tests of the decode step's new launches (argmax, row gather) and the captured zoo decode;
# - argmax_speed.py (ours against torch's argmax, graphs of 100 calls);
# - issue 43 item 7: the first (prefill) step of a closed batch of 32 (T 0.8, seeded) under torch.profiler,
#   plain and n-gram (call 1: 28.4 against 49.6 ms), on the widened zoo;
# - bench families on the Qwen3-Next slice and the Step-3.5 slice after f4c6085, then the slice before it
#   (.snapB: the four files f4c6085 changed, as they were) in the same call.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
cd .snap; S=$(pwd); export PYTHONPATH=.
timeout 150 python3 -m pytest -v tests/layers/test_argmax.py tests/engine/test_request_rows_kernel.py \
  tests/gpu/test_gpu.py -k "not eager" > $OUT/logs/tests.log 2>&1
echo "rc=$?" >> $OUT/logs/tests.log
timeout 40 python3 benchmarks/scripts/argmax_speed.py --out $OUT/argmax_speed.json > $OUT/logs/argmax.log 2>&1
timeout 90 python3 -c "from pathlib import Path; from outpace.bench.e2e import widened_zoo; widened_zoo(Path('.e2e'))" \
  > $OUT/logs/widen.log 2>&1
for m in none ngram; do
  extra=""; [ $m = ngram ] && extra="--num-steps 4 --adaptive"
  timeout 60 python3 benchmarks/scripts/diag_closed_loop.py --model .e2e/tinypy --method $m $extra \
    --streams 32 --requests 32 --max-tokens 128 --temperature 0.8 --seed 0 --device cuda --dtype bfloat16 \
    --profile-steps 1 > $OUT/logs/diag_$m.log 2>&1
  echo "rc=$?" >> $OUT/logs/diag_$m.log
done
timeout 170 python3 -m outpace.bench.families --out $OUT/famA --no-verify \
  --shapes qwen3-next-80b-slice,step-3.5-flash-slice > $OUT/logs/famA.log 2>&1
echo "rc=$?" >> $OUT/logs/famA.log
B=$(mktemp -d) && cp -r outpace benchmarks $B/ && cp -r ../.snapB/outpace $B/ && cd $B
timeout 100 python3 -m outpace.bench.families --out $OUT/famB --no-verify --shapes qwen3-next-80b-slice \
  > $OUT/logs/famB.log 2>&1
echo "rc=$?" >> $OUT/logs/famB.log
cd $OUT && tar czf logs.tgz logs
grep -E "passed|failed|rc=" logs/tests.log | tail -n 3; cat logs/argmax.log | tail -n 17
for m in none ngram; do echo "== $m"; grep -A 14 "under torch" logs/diag_$m.log | cut -c1-150; tail -n 6 logs/diag_$m.log; done
for f in famA famB; do echo "== $f"; grep -v "%|" logs/$f.log | tail -n 8; done
rm -rf logs
