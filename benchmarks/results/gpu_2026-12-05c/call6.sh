#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-05c: the attention kernels' cache prefetch before the dependent launch's wait
# (prefetch_kv_rows, off as shipped) on the paged kernel (Llama-3.1-8B, Qwen3-30B-A3B) and MLA (DeepSeek-V2-Lite).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for s in v2 qwen3 llama; do
  timeout 75 python3 benchmarks/scripts/decode_settings.py $OUT/kv_prefetch_$s.json kv_prefetch_$s >> $OUT/settings.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "step ms|shipped|prefetch|rc=|Error" $OUT/settings.log | grep -v " b[0-9]*@"
