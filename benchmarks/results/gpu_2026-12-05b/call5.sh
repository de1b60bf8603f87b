#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-05b (nvidia-h200): launch settings on the A3B MoE shapes' decode step
# (decode_settings.py a3b_qwen3, cut at the session's last device seconds: its first pass; the narrow o_proj's K step and stages, the attention's split grid, the
# bf16 experts' few-token tiles), step ms at batch 1 and 8, 512 cached; first Mistral 4's GPU test (the fused MLA
# path with the query scale by position).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
run() {  # SWEEP SECONDS
  timeout $2 python3 benchmarks/scripts/decode_settings.py $OUT/$1.json $1 > $OUT/$1.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/$1.log
}
timeout 90 python3 -m pytest -v -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/gpu/test_gpu_moe_families.py \
  -k mistral4 > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
run a3b_qwen3 $(( 265 - SECONDS ))
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E " (PASSED|FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 4
for f in $OUT/a3b*.log; do echo "== $(basename $f)"; grep -E "^ +[0-9]|rc=|Error" $f | tail -n 10; grep -E "^  \{|^  shipped" $f | tail -n 6; done
