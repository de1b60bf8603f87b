#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01d (nvidia-h200: the machine of two GPUs was no longer lent), from .snap/ (a git
# archive of HEAD): a request that surely ends no longer stops the others' step run ahead (issue 43 item 7).
#   The run-ahead tests on CUDA; closed_batch_rounds.py (n-gram, 5 rounds); bench families of shapes call 1 left
#   out (kernels a step recounted after this week's launches); the step timelines of Gemma-3-12B and
#   Nemotron-H-8B at batch 1 (both 0.5 points under 0.80 of the floor).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 120 python3 -m pytest $T tests/engine/test_run_ahead_rule.py tests/engine/test_cuda_graphs.py \
  > $OUT/logs/t_ahead.log 2>&1
echo "rc=$?" >> $OUT/logs/t_ahead.log
timeout 150 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram \
  --batches 8 32 --rounds 5 --workdir .e2e --out $OUT/rounds.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
timeout $(( 500 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 490 - SECONDS )) \
  --shapes nemotron-h-8b,gemma-3-12b,deepseek-v2-lite > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/tl gemma-3-12b@1 nemotron-h-8b@1 \
  > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
cp $OUT/tl/* $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_ahead"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_ahead.log | tail -n 6
echo "== rounds"; grep -v "%|" $OUT/logs/rounds.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=" | tail -n 22
echo "== tl"; tail -n 3 $OUT/logs/tl.log
