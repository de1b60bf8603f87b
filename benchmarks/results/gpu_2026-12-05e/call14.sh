#!/usr/bin/env bash
# Device call 14 of gpu_2026-12-05e: bench e2e on the widened Qwen3.5 and DeepSeek, plain decoding against MTP at
# batch 1, after the zoo's tinyqwen35 and tinyds MTP layers were fine-tuned on their targets' continuations (gpu_2026-12-04f
# call 3: Qwen3.5 1.99x; gpu_2026-12-02 call 15: DeepSeek 1.44x).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for family in qwen35 deepseek; do
  timeout $(( 580 - SECONDS )) python3 -m outpace bench e2e --family $family --batch-sizes 1 --methods none mtp \
    --out $OUT/e2e_$family --workdir /tmp/e2e_$family > $OUT/e2e_$family.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_$family.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log) $(cd $OUT && find e2e_* -name "*.json" 2>/dev/null)
for family in qwen35 deepseek; do grep -E -A6 "^method|rc=" $OUT/e2e_$family.log | tail -n 8; done
