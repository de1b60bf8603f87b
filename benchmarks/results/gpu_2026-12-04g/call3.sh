#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-04g (nvidia-h200): the paged attention's split-KV grid in the Llama-3.1-8B shape's
# decode step (attention/triton_kernels.py _PROGRAMS_PER_SM: 2 shipped; 0 one split and no merge launch; 0.125 and
# 0.25 three and five splits at batch 1), batch 1 at 512 and 2048 cached tokens, batch 8 at 512.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 320 python3 benchmarks/scripts/decode_settings.py $OUT/attention_splits_llama.json attention_splits_llama \
  > $OUT/settings.log 2>&1
rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/settings.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
tail -n 8 $OUT/settings.log
