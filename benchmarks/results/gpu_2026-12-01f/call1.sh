#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01f (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the run-ahead one-launch drop case fixed last session (not re-run on a GPU), n-gram's closed batch at
# temperature 0.8 step by step (issue 43 item 7), and bench families of the Step slice (twice: its batch 1 sits
# at 0.80), Gemma 4 and DeepSeek-V2-Lite (not measured since the route kernel's packed keys): the baseline of
# this session's changes.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 60 python3 -m pytest $T tests/engine/test_run_ahead_rule.py > $OUT/logs/t_ahead.log 2>&1
echo "rc=$?" >> $OUT/logs/t_ahead.log
timeout 170 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 --temperatures 0.8 \
  --rounds 3 --workdir /tmp/e2e --out $OUT/rounds.json --steps $OUT/steps.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
timeout $(( 500 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 490 - SECONDS )) \
  --shapes step-3.5-flash-slice,deepseek-v2-lite,gemma-4-26b-a4b > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam2 --no-verify --time-limit $(( 575 - SECONDS )) \
  --shapes step-3.5-flash-slice > $OUT/logs/fam2.log 2>&1
echo "rc=$?" >> $OUT/logs/fam2.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== ahead"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_ahead.log | tail -n 6
echo "== rounds"; grep -vE "%\||widening" $OUT/logs/rounds.log | tail -n 12
for f in fam fam2; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 14; done
