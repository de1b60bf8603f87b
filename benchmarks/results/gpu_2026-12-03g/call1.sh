#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03g (nvidia-h200), run from the checkout (carry: .whl, the server's wheels):
# (1) the grouped FP8 experts with PDL on DeepSeek-V2-Lite (decode_settings.py moe_fp8_pdl); (2) the router logits'
# tl.dot path in tf32x3 inside V2-Lite's batch-32 step (router_dot_v2); (3) every test marked gpu.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=.:/tmp/site
timeout 110 python3 benchmarks/scripts/decode_settings.py $OUT/moe_fp8_pdl.json moe_fp8_pdl > $OUT/pdl.log 2>&1
timeout 70 python3 benchmarks/scripts/decode_settings.py $OUT/router_dot_v2.json router_dot_v2 > $OUT/rdot.log 2>&1
timeout $(( 588 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 8 --dist loadscope -m gpu --tb=line -rfE \
  --durations=15 tests > $OUT/pytest_gpu.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_gpu.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -v Warning $OUT/pdl.log | tail -n 12
grep -v Warning $OUT/rdot.log | tail -n 8
grep -E "^(FAILED|ERROR)|passed|failed|rc=|s call|s setup" $OUT/pytest_gpu.log | tail -n 45
