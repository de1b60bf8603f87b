#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-05b (nvidia-h200): launch settings on the A3B MoE shapes' decode step
# (decode_settings.py a3b_qwen3, a3b_qwen35: the narrow o_proj's K step and stages, the attention's split grid, the
# bf16 experts' few-token tiles), step ms at batch 1 and 8, 512 cached.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
run() {  # SWEEP SECONDS
  timeout $2 python3 benchmarks/scripts/decode_settings.py $OUT/$1.json $1 > $OUT/$1.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$1.log
}
run a3b_qwen3 250
run a3b_qwen35 $(( 440 - SECONDS ))
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for f in $OUT/*.log; do echo "== $(basename $f)"; grep -E "^ +[0-9]|rc=|Error" $f | tail -n 10; grep -E "^  \{|^  shipped" $f | tail -n 6; done
