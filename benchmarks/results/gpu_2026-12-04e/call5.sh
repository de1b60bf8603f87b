#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-04e (nvidia-h200), the session's last: (1) GPU tests: the routing kernels with the
# sorted top_k (98bc497), the MLA attention and merge under PDL (efba143), the fp8 products' SiLU store on the wide
# tiles (its exact bits on the GPU; call 1 ran -m gpu only, which left that unmarked test out); (2) routing_timings
# (the sorted top_k alone); (3) decode_settings one_token_qwen3next_fp8: one token's FP8 expert tiles and the sorted
# top_k in the Qwen3-Next slice's step; (4) bench families in block FP8 after this session's changes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/kernels/test_moe_routing.py \
  tests/kernels/test_fp8_linear.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_mla_kernel.py \
  tests/kernels/test_mla_fused.py > $OUT/pytest_mla.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_mla.log
timeout 45 python3 benchmarks/scripts/routing_timings.py $OUT/routing qwen3-next-80b step-3.5-flash \
  deepseek-v2-lite > $OUT/routing.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/routing.log
timeout 170 python3 benchmarks/scripts/decode_settings.py $OUT/one_token_qwen3next.json one_token_qwen3next_fp8 \
  > $OUT/one_token.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/one_token.log
timeout $(( 540 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find routing fam_fp8 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log $OUT/pytest_mla.log | tail -n 10
grep -E "qwen3-next|step|rc=" $OUT/routing.log | grep -E " 1 tokens| 8 tokens|rc=" | cut -c1-200
grep -v Warn $OUT/one_token.log | tail -n 8
grep -v -E "Warn|^ *$" $OUT/fam_fp8.log | tail -n 9
