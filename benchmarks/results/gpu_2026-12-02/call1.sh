#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the chooser reading the batch-wide rates one standard error up (adaptive.OPTIMISM) on the rows it is for: the
# widened DeepSeek's and Qwen3.5's MTP rows at batch 1 (DeepSeek at 0.8 drafted in 1% of its verifies in
# gpu_2026-12-01j call 5), and n-gram's closed batches at 0.8, which it should leave as they were. Each widened
# checkpoint is removed after its row (call 5's third part found the 64 GiB disk full).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
for fam in deepseek qwen35; do
  timeout $([ $fam = deepseek ] && echo 230 || echo 180) python3 -m outpace bench e2e --family $fam --batch-sizes 1 --methods none mtp \
    --out /tmp/out_$fam --workdir /tmp/e2e_$fam > $OUT/logs/e2e_$fam.log 2>&1
  echo "rc=$?" >> $OUT/logs/e2e_$fam.log
  cp /tmp/out_$fam/*.json $OUT/logs/ 2>/dev/null
  rm -rf /tmp/e2e_$fam
done
df -h /tmp | tail -1 >> $OUT/logs/e2e_qwen35.log
timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 \
  --temperatures 0.8 --rounds 5 --workdir /tmp/e2e --out $OUT/logs/rounds.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
for fam in deepseek qwen35; do tar xzf $OUT/logs.tgz -O logs/e2e_$fam.log | grep -E -A6 "^method|rc=" | tail -n 7; done
tar xzf $OUT/logs.tgz -O logs/rounds.log | grep -vE "widening" | tail -n 6
