#!/usr/bin/env bash
# Device call 10 (gpu_2026-12-05d): the rest of the sweeps, on the shapes call 9 leaves: the split merge and
# qkv_split_k on Gemma-3-12B, the 16-column gate/up tiles on Qwen3.5-35B-A3B, MLA's cache prefetch on
# DeepSeek-V2-Lite, and qkv_split_k on Gemma 4 (given 200 s as in gpu_2026-12-05c's call7.sh).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for s in merge_in_kernel_gemma3:100 qkv_split_k_gemma3:100 gate_up_n16_qwen35:70 kv_prefetch_v2:70 \
    qkv_split_k_gemma4:200; do
  timeout ${s#*:} python3 benchmarks/scripts/decode_settings.py $OUT/${s%:*}.json ${s%:*} >> $OUT/settings.log 2>&1
  echo "rc=$? ${s%:*} after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "step ms|shipped|prefetch|split|merge|few_token|rc=|Error" $OUT/settings.log | grep -v " b[0-9]*@"
