#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-05c: the Mistral Small 4 slice benched (call 2 stopped on its missing time estimate),
# and the gate/up few-token tiles that won on the A3B shapes (calls 1 and 2) on the other MoE shapes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m outpace.bench.families --out $OUT/bench --no-verify --shapes mistral-small-4-slice \
  > $OUT/bench.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/bench.log
for s in v2 v2_fp8 gemma4 qwen3next mistral4; do
  timeout 110 python3 benchmarks/scripts/decode_settings.py $OUT/gate_up_$s.json gate_up_k256_$s >> $OUT/settings.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -v Warning $OUT/bench.log | tail -n 8
grep -E "step ms|shipped|few_token|rc=|Error" $OUT/settings.log
