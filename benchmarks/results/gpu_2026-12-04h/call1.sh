#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04h (nvidia-h200): the previous session's route warps and 16-row blocks past 64 tokens
# in the decode step, and the grouped experts' 16-row tiles at Gemma 4's and V2-Lite's shapes (decode_settings.py).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
run() {  # SWEEP SECONDS
  timeout $2 python3 benchmarks/scripts/decode_settings.py $OUT/$1.json $1 > $OUT/$1.log 2>&1
  rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/$1.log
}
run many_token_route_v2 110
run many_token_route_v3_fp8 110
run small_blocks_qwen3next_fp8 110
run expert_tiles_gemma4 150
run expert_tiles_v2 100
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
for f in $OUT/*.log; do echo "== $(basename $f)"; grep -vE "^  " $f | tail -n 9; done
