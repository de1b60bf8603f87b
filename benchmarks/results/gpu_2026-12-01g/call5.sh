#!/bin/bash
# Call 5: DeepSeek's MTP in bench e2e at batch 1 (the closed batch's one-off costs, call 3), with the MTP layer as
# a fused stack of one (.snap, this commit) and without (.snapB: this commit with models/drafts/mtp.py,
# models/drafts/hybrid_mtp.py, models/step3p5.py and layers/fused_decoder.py as at 51964b3).
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
for s in .snapB .snap; do
  ( cd $s; export PYTHONPATH=.
    timeout $(( 330 - SECONDS )) python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods mtp \
      --out $OUT/e2e${s#.snap} --workdir /tmp/e2e_ds > $OUT/logs/e2e${s#.snap}.log 2>&1
    echo "$s rc=$?"; grep -A4 "^method" $OUT/logs/e2e${s#.snap}.log )
done
cp $OUT/e2e*/*.json $OUT/logs/ 2>/dev/null
tar -czf $OUT/logs.tgz -C $OUT logs
