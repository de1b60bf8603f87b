#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-03e (nvidia-h200), the session's last: (1) batch-invariant mode's cost on the MoE
# shapes whose router logits now sum token by token in the mode (DeepSeek-V2-Lite, the Step-3.5 slice); (2) every
# test marked gpu, in the time left.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
timeout 170 python3 benchmarks/scripts/batch_invariant_speed.py \
  --shapes deepseek-v2-lite,step-3.5-flash-slice --out $OUT/invariant_speed.json > $OUT/speed.log 2>&1
timeout $(( 575 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadscope -m gpu --tb=line -rfE \
  tests > $OUT/pytest_gpu.log 2>&1
echo "rc=$?" >> $OUT/pytest_gpu.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -v Warning $OUT/speed.log | tail -n 6
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest_gpu.log | tail -n 30
