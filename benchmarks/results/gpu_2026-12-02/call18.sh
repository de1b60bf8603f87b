#!/usr/bin/env bash
# Device call 18 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script): the
# few-row SwiGLU's sub-tiles and K step inside the captured decode step (call 17's projection_rows.py had
# Llama-8B's gate/up alone 3.2% faster in sub-tiles of 64 at BK 128): decode_settings.py's swiglu sweeps on the
# Llama-3.1-8B shape, Qwen3.5 and Gemma-3-12B at batch 1 and 8 over 512 cached tokens; first projection_rows.py
# again, now with the LM heads of Llama-8B and Gemma-3-12B.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 100 python3 benchmarks/scripts/projection_rows.py $OUT/logs/rows.json \
  "llama-8b lm_head" "gemma-3 lm_head" > $OUT/logs/rows.log 2>&1
echo "rc=$?" >> $OUT/logs/rows.log
for s in swiglu_llama swiglu_qwen35 swiglu_gemma3; do
  left=$((570 - SECONDS))
  [ $left -gt 60 ] && timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/logs/$s.json $s \
    > $OUT/logs/$s.log 2>&1
  echo "rc=$?" >> $OUT/logs/$s.log
done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/rows.log | grep -E "lm_head|rc="
for s in swiglu_llama swiglu_qwen35 swiglu_gemma3; do
  tar xzf $OUT/logs.tgz -O logs/$s.log | grep -v "^  {\|^  shipped" | tail -n 8
done
