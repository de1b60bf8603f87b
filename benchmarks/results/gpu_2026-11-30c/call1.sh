#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: projection_tiles.py (the fused projections' weight bytes in flight: BK, stages, warps, programs) and
#          mla_settings.py (the fused MLA kernels' tile size and stages on V2-Lite's decode step);
#   GPU 1: step timelines without PDL (each kernel's own time) at batch 8 of the hybrids and Qwen3-Next, and
#          Gemma-3 at batch 1; then the MLA kernel tests (batch-invariant MLA among them) and the route tests.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 benchmarks/scripts/projection_tiles.py $OUT/logs/projection_tiles.json > $OUT/logs/tiles.log 2>&1
  echo "tiles rc=$?" >> $OUT/logs/tiles.log
  timeout 200 python3 benchmarks/scripts/mla_settings.py $OUT/logs/mla_settings.json > $OUT/logs/mla.log 2>&1
  echo "mla rc=$?" >> $OUT/logs/mla.log ) &
( export CUDA_VISIBLE_DEVICES=1
  OUTPACE_PDL=0 timeout 200 python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl_nopdl qwen3.5@8 nemotron-h-8b@8 qwen3-next-80b-slice@8 gemma-3-12b@1 --lines 0 > $OUT/logs/tl.log 2>&1
  echo "tl rc=$?" >> $OUT/logs/tl.log
  timeout 150 python3 -m pytest -q -x tests/kernels/test_mla_kernel.py > $OUT/logs/t_mla.log 2>&1
  echo "t_mla rc=$?" >> $OUT/logs/t_mla.log
  timeout 120 python3 -m pytest -q -x tests/kernels/test_moe_routing.py > $OUT/logs/t_route.log 2>&1
  echo "t_route rc=$?" >> $OUT/logs/t_route.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tiles"; grep -E "m= 1|rc=" $OUT/logs/tiles.log
echo "== mla"; tail -n 10 $OUT/logs/mla.log
echo "== tl"; grep -E "kernels and|Error|rc=" $OUT/logs/tl.log | tail -n 6
echo "== tests"; tail -n 2 $OUT/logs/t_mla.log $OUT/logs/t_route.log
