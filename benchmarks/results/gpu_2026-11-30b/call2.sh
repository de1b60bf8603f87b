#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: mla_settings.py (V2-Lite decode step at each min_split_rows x MAX_Q_PARTS), then the GPU tests of
#          what changed (argmax, the MLA kernels and the fused MLA block);
#   GPU 1: step_timeline.py without programmatic dependent launch (each kernel's own time) for the families
#          not yet looked at this way.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 benchmarks/scripts/mla_settings.py $OUT/logs/mla_settings.json > $OUT/logs/mla.log 2>&1
  echo "mla rc=$?" >> $OUT/logs/mla.log
  timeout $(( 560 - SECONDS )) python3 -m pytest -q tests/layers/test_argmax.py tests/kernels/test_mla_kernel.py \
      tests/kernels/test_mla_fused.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log ) &
( export CUDA_VISIBLE_DEVICES=1
  OUTPACE_PDL=0 timeout 500 python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl qwen3.5@1 nemotron-h-8b@1 \
      nemotron-h-8b@8 gemma-3-12b@1 step-3.5-flash-slice@1 qwen3-next-80b-slice@8 --lines 0 > $OUT/logs/tl.log 2>&1
  echo "tl rc=$?" >> $OUT/logs/tl.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== mla"; tail -n 12 $OUT/logs/mla.log
echo "== tests"; tail -n 4 $OUT/logs/tests.log
echo "== tl"; grep -E "span|rc=|Error" $OUT/logs/tl.log | tail -n 10
