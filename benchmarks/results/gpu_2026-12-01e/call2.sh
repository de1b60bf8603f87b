#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01e (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
#   Step-3.5's head-wise gate projected in q/k/v's launch, and the experts' combine adding their output to the
#   stream and readying the next layer's norm (Qwen3-Next, Step-3.5 on one GPU), the route kernel's top-k picks
#   over packed keys. GPU tests of both, then bench
#   families of the two slices and their step timelines at batch 1 (with the route kernel's packed top-k keys).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 60 python3 -m pytest $T tests/layers/test_fused_projection.py -k "qkv" > $OUT/logs/t_qkv.log 2>&1
echo "rc=$?" >> $OUT/logs/t_qkv.log
timeout 150 python3 -m pytest $T tests/kernels/test_moe_kernel.py tests/kernels/test_moe_routing.py \
  tests/models/test_step3p5_fused.py tests/models/test_hybrid_fused.py > $OUT/logs/t_kernels.log 2>&1
echo "rc=$?" >> $OUT/logs/t_kernels.log
timeout 200 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py -k "qwen3_next or step3p5" > $OUT/logs/t_moe.log 2>&1
echo "rc=$?" >> $OUT/logs/t_moe.log
timeout $(( 520 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --time-limit $(( 510 - SECONDS )) --shapes step-3.5-flash-slice,qwen3-next-80b-slice > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs step-3.5-flash-slice@1 qwen3-next-80b-slice@1 --lines 0 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_qkv"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_qkv.log | tail -n 8
echo "== t_kernels"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_kernels.log | tail -n 8
echo "== t_moe"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_moe.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 14
echo "== tl"; grep -E "kernels|span|rc=|Error" $OUT/logs/timeline_* $OUT/logs/tl.log | tail -n 4
