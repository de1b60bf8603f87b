#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-05c (written for the next session with a device): two launch changes that are off
# as shipped, each against the shipped path in the decode step. The attention kernels' cache prefetch before the
# dependent launch's wait (prefetch_kv_rows) on the paged kernel (Llama-3.1-8B, Qwen3-30B-A3B) and MLA
# (DeepSeek-V2-Lite); q/k/v with per-head norms in one launch, K split among a head's programs (qkv_split_k), on
# Qwen3-30B-A3B, Gemma-3-12B and Gemma 4.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for s in kv_prefetch_v2 kv_prefetch_qwen3 kv_prefetch_llama qkv_split_k_qwen3 qkv_split_k_gemma3 qkv_split_k_gemma4; do
  timeout 90 python3 benchmarks/scripts/decode_settings.py $OUT/$s.json $s >> $OUT/settings.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "step ms|shipped|prefetch|split|rc=|Error" $OUT/settings.log | grep -v " b[0-9]*@"
