#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04g (nvidia-h200): (1) the MoE routing and grouped-expert tests on CUDA, first run of
# the routing kernel laying out up to 128 tokens itself (4208916), among them the captured layout at 65 / 96 / 128
# tokens; (2) the router matvec aiming for 1056 programs past 64 tokens in the Qwen3-Next slice's block-FP8 step at
# batch 96 and 128; (3) routing_timings at Qwen3-Next's router (96 / 128 / 129 tokens now); (4) bench families with
# its verify rows, the Qwen3-Next slice in block FP8, as the time left allows.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 --tb=short -rfE tests/kernels/test_moe_routing.py \
  tests/kernels/test_family_routers.py tests/kernels/test_moe_kernel.py tests/gpu/test_gpu_moe_families.py \
  > $OUT/pytest.log 2>&1
rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/pytest.log
timeout 170 python3 benchmarks/scripts/decode_settings.py $OUT/many_token_logits.json many_token_logits_qwen3next \
  > $OUT/settings.log 2>&1
rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/settings.log
timeout 90 python3 benchmarks/scripts/routing_timings.py $OUT/routing qwen3-next-80b > $OUT/routing.log 2>&1
rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/routing.log
left=$(( 575 - SECONDS ))
if [ $left -gt 60 ]; then
  timeout $left python3 -m outpace.bench.families --out $OUT/fam --quantized fp8 --shapes qwen3-next-80b-slice \
    --time-limit $(( left - 30 )) > $OUT/fam.log 2>&1
  rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/fam.log
fi
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find routing fam -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
tail -n 8 $OUT/settings.log
grep -E "tokens|rc=" $OUT/routing.log | tail -n 9
tail -n 25 $OUT/fam.log 2>/dev/null
