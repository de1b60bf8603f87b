#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01e (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
#   the GPU tests gpu_2026-12-01d left unrun (the sandwich norms' kernels, Step-3.5's fused layers, the Step-3.5
#   fused residual stack's captured decode on fp32 rows), then one decode step's kernels (step_timeline.py) of
#   the shapes still under the floor targets: Qwen3-Next slice at batch 1 and 8, Step-3.5 slice, V2-Lite,
#   Gemma 4 at batch 1.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 150 python3 -m pytest $T tests/layers/test_sandwich_norms.py tests/models/test_step3p5_fused.py > $OUT/logs/t_fused.log 2>&1
echo "rc=$?" >> $OUT/logs/t_fused.log
timeout 150 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py -k "fused_residual and step3p5" > $OUT/logs/t_moe.log 2>&1
echo "rc=$?" >> $OUT/logs/t_moe.log
timeout $(( 560 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs qwen3-next-80b-slice@1 \
  qwen3-next-80b-slice@8 step-3.5-flash-slice@1 deepseek-v2-lite@1 gemma-4-26b-a4b@1 --lines 0 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_fused"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_fused.log | tail -n 8
echo "== t_moe"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_moe.log | tail -n 8
echo "== tl"; grep -E "kernels|span|rc=|Error" $OUT/logs/tl.log $OUT/logs/timeline_* | tail -n 14
