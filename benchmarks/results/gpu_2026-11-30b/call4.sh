#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: the route kernel's tokens in parallel (bbdc467, 0372910): its GPU tests (the graph test can catch a
#          race), routing_timings.py, then bench families for the MoE shapes it serves, beside call 3 / call 1;
#   GPU 1: where MTP loses batch-invariant bits on the hybrid (diag_batch_invariant_hybrid_gpu.py); bench e2e
#          --family qwen35 at batch 32 after 15db450 (pooled acceptance), beside call 1; the MoE GPU tests.
# Copy call3/fam (c3fam), call3/famN (c3famN) and gpu_2026-11-30 call1/fam (c1fam) into .snap.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -q tests/kernels/test_moe_routing.py tests/kernels/test_family_routers.py \
      > $OUT/logs/route_tests.log 2>&1; echo "route tests rc=$?" >> $OUT/logs/route_tests.log
  timeout 100 python3 benchmarks/scripts/routing_timings.py $OUT/logs/rt > $OUT/logs/rt.log 2>&1
  echo "rt rc=$?" >> $OUT/logs/rt.log
  timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
      --compare-with c3fam c3famN c1fam --shapes qwen3-next-80b-slice,gemma-4-26b-a4b,deepseek-v2-lite \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 90 python3 benchmarks/scripts/diag_batch_invariant_hybrid_gpu.py > $OUT/logs/diag.log 2>&1
  echo "diag rc=$?" >> $OUT/logs/diag.log
  timeout 300 python3 -m outpace bench e2e --family qwen35 --batch-sizes 32 --methods none mtp eagle3 \
      --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log
  timeout $(( 560 - SECONDS )) python3 -m pytest -q tests/kernels/test_moe_kernel.py tests/gpu/test_gpu_moe_families.py \
      > $OUT/logs/moe_tests.log 2>&1; echo "moe tests rc=$?" >> $OUT/logs/moe_tests.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null; cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== route tests"; tail -n 3 $OUT/logs/route_tests.log
echo "== rt"; grep -v "^\s*$" $OUT/logs/rt.log | tail -n 30
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 12
echo "== diag"; grep -v "%|" $OUT/logs/diag.log | tail -n 10
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 9
echo "== moe tests"; tail -n 3 $OUT/logs/moe_tests.log
