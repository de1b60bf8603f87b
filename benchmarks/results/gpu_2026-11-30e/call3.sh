#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: deltanet_step_settings.py (the step kernel's value-column splits x warps at Qwen3.5's shape, batch
#          1 / 2 / 4, runs of 1..4 tokens: call 2's verify timeline had the split kernel slower at 2 and 3 tokens),
#          then tests/kernels/test_deltanet_step.py with room to finish (call 2 cut it at 120 s).
#   GPU 1: decode_settings.py mla_down (the down kernel now streams q_proj too: 8.8 us a layer in call 2), then
#          tests/kernels/test_mla_fused.py with room to finish.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 benchmarks/scripts/deltanet_step_settings.py $OUT/logs/deltanet_settings.json \
      > $OUT/logs/dn.log 2>&1; echo "dn rc=$?" >> $OUT/logs/dn.log
  timeout $(( 560 - SECONDS )) python3 -m pytest -q tests/kernels/test_deltanet_step.py > $OUT/logs/t_deltanet.log 2>&1
  echo "t_deltanet rc=$?" >> $OUT/logs/t_deltanet.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 300 python3 benchmarks/scripts/decode_settings.py $OUT/logs/mla_down.json mla_down \
      > $OUT/logs/md.log 2>&1; echo "md rc=$?" >> $OUT/logs/md.log
  timeout $(( 560 - SECONDS )) python3 -m pytest -q tests/kernels/test_mla_fused.py > $OUT/logs/t_mla_fused.log 2>&1
  echo "t_mla_fused rc=$?" >> $OUT/logs/t_mla_fused.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== dn"; grep -E "^b[0-9]|Error|rc=" $OUT/logs/dn.log | tail -n 40
echo "== md"; grep -A12 "(step ms)" $OUT/logs/md.log; grep -E "Error|rc=" $OUT/logs/md.log | tail -3
for n in t_deltanet t_mla_fused; do echo "== $n"; grep -E "passed|failed|Error|rc=" $OUT/logs/$n.log | tail -n 4; done
