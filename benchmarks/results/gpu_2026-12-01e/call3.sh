#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01e (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
#   a MoE block on the fused stack reads the stream made ready for its norm (RowNorm: the routing kernel scales
#   the logits, the gate/up kernel its products); grouped_experts' refusals before its first launch. GPU tests,
#   then bench families of the Qwen3-Next and Step slices, Gemma 4 and V2-Lite (the route kernel's packed
#   keys), and the Qwen3-Next slice's step timeline at batch 1.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 80 python3 -m pytest $T tests/kernels/test_moe_kernel.py > $OUT/logs/t_moe_kernel.log 2>&1
echo "rc=$?" >> $OUT/logs/t_moe_kernel.log
timeout 80 python3 -m pytest $T tests/kernels/test_moe_routing.py -k "ready_for_its_norm or gpu or shared_gate or ties" > $OUT/logs/t_routing.log 2>&1
echo "rc=$?" >> $OUT/logs/t_routing.log
timeout 150 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py -k "qwen3_next or step3p5 or gemma4" > $OUT/logs/t_moe.log 2>&1
echo "rc=$?" >> $OUT/logs/t_moe.log
timeout $(( 530 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 520 - SECONDS )) \
  --shapes qwen3-next-80b-slice,step-3.5-flash-slice,gemma-4-26b-a4b,deepseek-v2-lite > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs qwen3-next-80b-slice@1 --lines 0 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs
for t in t_moe_kernel t_routing t_moe; do echo "== $t"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$t.log | tail -n 6; done
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 18
echo "== tl"; grep -E "kernels|span|rc=|Error" $OUT/logs/timeline_* | tail -n 3
