#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01e (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# the session's last: Qwen3-Next's gated attention heads in one kernel, gated DeltaNet's decode in one launch,
# a step run ahead saving its rows' state in one launch. GPU tests of the three, then bench families of the
# Qwen3-Next slice, Qwen3.5 and the Step slice, and the Qwen3-Next slice's step timeline at batch 8.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 90 python3 -m pytest $T tests/engine/test_copy_pieces.py tests/engine/test_run_ahead_rule.py \
  tests/kernels/test_deltanet_step.py > $OUT/logs/t_engine.log 2>&1
echo "rc=$?" >> $OUT/logs/t_engine.log
timeout 45 python3 -m pytest $T tests/layers/test_fused_projection.py -k "qkv_gate" > $OUT/logs/t_qkv.log 2>&1
echo "rc=$?" >> $OUT/logs/t_qkv.log
timeout 130 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py -k "qwen3_next or qwen3_5" > $OUT/logs/t_moe.log 2>&1
echo "rc=$?" >> $OUT/logs/t_moe.log
timeout $(( 420 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 410 - SECONDS )) \
  --shapes qwen3-next-80b-slice,step-3.5-flash-slice,qwen3.5 > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 462 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs qwen3-next-80b-slice@8 --lines 0 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs
for t in t_engine t_qkv t_moe; do echo "== $t"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$t.log | tail -n 6; done
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 14
echo "== tl"; grep -E "kernels|span|rc=|Error" $OUT/logs/timeline_* | tail -n 3
