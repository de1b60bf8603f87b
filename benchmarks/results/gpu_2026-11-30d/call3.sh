#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side, after 9203f5e
# (the recurrent states' verify commit in one launch):
#   GPU 0: the commit kernel's test compiled; verify_timeline.py for Qwen3.5 and Nemotron-H at batch 1 (call 2
#          before); bench families for both with the verify sweep, beside call 1's (c1famB).
#   GPU 1: the hybrids' batch-invariant GPU tests; bench e2e --family qwen35 at batch 1 and 32 beside call 1.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 -m pytest -q tests/kernels/test_state_commit_kernel.py > $OUT/logs/test_state_commit_kernel.log 2>&1
  echo "test_state_commit_kernel rc=$?" >> $OUT/logs/test_state_commit_kernel.log
  timeout 150 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/vt qwen3.5@1 nemotron-h-8b@1 \
      > $OUT/logs/vt.log 2>&1; echo "vt rc=$?" >> $OUT/logs/vt.log
  timeout $(( 540 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famB --compare-with c1famB \
      --shapes qwen3.5,nemotron-h-8b > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 100 python3 -m pytest -q tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/logs/test_bi_hybrids.log 2>&1
  echo "test_bi_hybrids rc=$?" >> $OUT/logs/test_bi_hybrids.log
  timeout $(( 540 - SECONDS )) python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 32 \
      --methods none mtp eagle3 --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
for n in test_state_commit_kernel test_bi_hybrids; do
  echo "== $n"; grep -E "passed|failed|error|rc=" $OUT/logs/$n.log | tail -n 3; done
echo "== vt"; grep -E "replay span" -A8 $OUT/logs/vt.log | cut -c1-120
echo "== famB"; grep -v "%|" $OUT/logs/famB.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 12
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 12
