#!/usr/bin/env bash
# Device call 20 (after call 19, on the same machine if it is still warm: /tmp/e2e_deepseek is reused): MTP's
# closed batches with the captured absorb. bench e2e on the widened DeepSeek at batch 1 and 8 (call 16, H100,
# eager absorb: MTP 1.90x steady, 1.62x closed at batch 1; 1.69x and 1.39x at 8), then Qwen3.5 at batch 1 (a hybrid:
# its forward prefills eagerly, its MTP layers absorb as captured; call 15: 2.30x, closed 2.05x).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m outpace bench e2e --family deepseek --batch-sizes 1 8 --methods none mtp \
  --out $OUT/e2e_deepseek --workdir /tmp/e2e_deepseek > $OUT/e2e_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_deepseek.log
timeout $(( 590 - SECONDS )) python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e_qwen35 --workdir /tmp/e2e_qwen35 > $OUT/e2e_qwen35.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_qwen35.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for family in deepseek qwen35; do grep -E -A10 "^method|rc=" $OUT/e2e_$family.log | tail -n 12; done
