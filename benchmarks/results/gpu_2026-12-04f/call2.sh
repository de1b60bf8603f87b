#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04f (nvidia-h200): (1) the routing tests with the router's tl.dot path in tf32x3 (now
# shipped); (2) bench families on the Qwen3-Next slice as published (call 1's run did not finish in 150 s: more time
# and, if it is cut, every thread's stack); (3) family_kernels: the kernels of V2-Lite's and the Qwen3-Next slice's
# block-FP8 batch-1 steps; (4) decode_settings router_dot_v2 (the tl.dot path's precision in V2-Lite's b32 step).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/kernels/test_moe_routing.py \
  tests/kernels/test_family_routers.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout -s ABRT 280 python3 -X faulthandler -m outpace.bench.families --out $OUT/fam_pub --no-verify \
  --quantized fp8-published --shapes qwen3-next-80b-slice > $OUT/fam_pub.log 2>&1
rc=$?; echo >> $OUT/fam_pub.log; echo "rc=$rc after ${SECONDS}s" >> $OUT/fam_pub.log
timeout 150 python3 benchmarks/scripts/family_kernels.py $OUT/kernels deepseek-v2-lite:fp8 \
  qwen3-next-80b-slice:fp8-published > $OUT/kernels.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/kernels.log
timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/router_dot_v2.json router_dot_v2 \
  > $OUT/router_dot_v2.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/router_dot_v2.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find kernels fam_pub -name "*.json" -o -name "*.txt" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v -E "Warn|^ *$" $OUT/fam_pub.log | tail -n 12
grep -v Warn $OUT/router_dot_v2.log | tail -n 4
grep -E "rc=" $OUT/kernels.log
