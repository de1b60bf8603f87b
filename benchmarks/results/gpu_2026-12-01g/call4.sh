#!/bin/bash
# Call 4: DeepSeek's MTP in closed batches at batch 1, three rounds, with the MTP layer as a fused stack of one
# (.snap, this commit) and before that change (.snapB, 51964b3 with this commit's scripts); families in block
# FP8 with 256 bytes a row prefetched.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
for s in .snap .snapB; do
  ( cd $s; export PYTHONPATH=.
    timeout 170 python3 benchmarks/scripts/closed_batch_rounds.py --family deepseek --methods mtp --batches 1 \
      --temperatures 0 0.8 --rounds 3 --workdir /tmp/e2e_ds --out $OUT/rounds_ds${s#.snap}.json \
      --steps $OUT/steps_ds${s#.snap}.json > $OUT/logs/rounds_ds${s#.snap}.log 2>&1
    echo "$s rc=$?"; grep -A6 "closed seconds by round" $OUT/logs/rounds_ds${s#.snap}.log; grep "^mtp " $OUT/logs/rounds_ds${s#.snap}.log | tail -2 )
done
cd .snap; export PYTHONPATH=.
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
  --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/logs/famQ.log 2>&1; tail -9 $OUT/logs/famQ.log
tar -czf $OUT/logs.tgz -C $OUT logs
