#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: moe_tiles.py (the grouped experts' few-token tiles), then host_profile.py where the step timeline
#          showed the GPU waiting on the host (the Qwen3-Next slice at batch 1);
#   GPU 1: decode_settings.py mamba2 (Nemotron-H's scan).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 170 python3 benchmarks/scripts/moe_tiles.py $OUT/logs/moe_tiles.json > $OUT/logs/moe.log 2>&1
  echo "moe rc=$?" >> $OUT/logs/moe.log
  timeout $(( 265 - SECONDS )) python3 benchmarks/scripts/host_profile.py $OUT/logs/host qwen3-next-80b-slice@1 \
      > $OUT/logs/host.log 2>&1
  echo "host rc=$?" >> $OUT/logs/host.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 265 python3 benchmarks/scripts/decode_settings.py $OUT/logs/mamba2_settings.json mamba2 \
      > $OUT/logs/mamba2.log 2>&1
  echo "mamba2 rc=$?" >> $OUT/logs/mamba2.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== moe"; grep -E "tokens|rc=" $OUT/logs/moe.log | grep -v "^  "
echo "== mamba2"; grep -v "%|" $OUT/logs/mamba2.log | grep -E "ms|rc=|setting" | tail -n 40
echo "== host"; grep -E "us a step|rc=|Error" $OUT/logs/host.log
