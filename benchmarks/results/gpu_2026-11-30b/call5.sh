#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the route kernel's GPU tests after the single token takes the ticket too;
#   GPU 1: the hybrids' batch-invariant GPU test (MTP against plain, captured and eager), then routing_timings.py.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 230 python3 -m pytest -q tests/kernels/test_moe_routing.py tests/kernels/test_family_routers.py \
      > $OUT/logs/route_tests.log 2>&1; echo "route tests rc=$?" >> $OUT/logs/route_tests.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 -m pytest -q tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/logs/bi.log 2>&1
  echo "bi rc=$?" >> $OUT/logs/bi.log
  timeout $(( 235 - SECONDS )) python3 benchmarks/scripts/routing_timings.py $OUT/logs/rt > $OUT/logs/rt.log 2>&1
  echo "rt rc=$?" >> $OUT/logs/rt.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== route tests"; grep -E "passed|failed|FAILED" $OUT/logs/route_tests.log | tail -n 4; tail -n 1 $OUT/logs/route_tests.log
echo "== bi"; grep -E "passed|failed|FAILED" $OUT/logs/bi.log | tail -n 6
echo "== rt"; grep -v "^\s*$" $OUT/logs/rt.log | cut -c1-150 | tail -n 32
