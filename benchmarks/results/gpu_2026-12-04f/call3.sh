#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-04f (nvidia-h200): (1) the routing tests with the router's tl.dot path in tf32x3
# (call 2's 100 s cut them at 75%, none failed); (2) bench e2e on the widened Qwen3.5, plain decoding against MTP at
# batch 1 (gpu_2026-12-02 call 16: 1.99x), after the sessions since.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 6 --tb=short -rfE tests/kernels/test_moe_routing.py \
  tests/kernels/test_family_routers.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout $(( 560 - SECONDS )) python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e --workdir /tmp/e2e_q > $OUT/e2e_qwen35.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_qwen35.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log 2>/dev/null) $(cd $OUT && find e2e -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -E -A6 "^method|rc=" $OUT/e2e_qwen35.log | tail -n 8
