#!/usr/bin/env bash
# Device call 7 of gpu_2026-12-05c (written for a session with a device, after call6.sh): what call6.sh left out. The gate/up tiles at a K step of 256
# on the Qwen3-Next slice (cut at 110 s during the prefill warm-up in call 3), and q/k/v with
# per-head norms in one launch (qkv_split_k) on Gemma 4's shape.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for s in gate_up_k256_qwen3next:260 qkv_split_k_gemma4:200; do
  timeout ${s#*:} python3 benchmarks/scripts/decode_settings.py $OUT/${s%:*}.json ${s%:*} >> $OUT/settings.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "step ms|shipped|split|k256|rc=|Error" $OUT/settings.log | grep -v " b[0-9]*@"
