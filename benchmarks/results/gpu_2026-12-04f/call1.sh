#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04f (nvidia-h200): (1) the DeltaNet step kernel projecting b/a from the rows itself
# (69fb5fd) and the two-format in-projection packing (db6d592) on CUDA; (2) bench families on the Qwen3-Next slice as
# published (fp8-published: in_proj_ba, the gates and the router stay bf16) against all-block-FP8; (3) routing_timings'
# matvec variants and decode_settings router_dot_qwen3next (the router's tl.dot path past 16 tokens).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/kernels/test_deltanet_step.py \
  tests/models/test_hybrid_fused.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 150 python3 -m outpace.bench.families --out $OUT/fam_pub --no-verify --quantized fp8-published \
  --shapes qwen3-next-80b-slice > $OUT/fam_pub.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_pub.log
timeout 50 python3 benchmarks/scripts/routing_timings.py $OUT/routing qwen3-next-80b deepseek-v2-lite \
  gemma-4-26b-a4b > $OUT/routing.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/routing.log
timeout 150 python3 benchmarks/scripts/decode_settings.py $OUT/router_dot.json router_dot_qwen3next \
  > $OUT/router_dot.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/router_dot.log
timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes qwen3-next-80b-slice > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find routing fam_pub fam_fp8 -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -E "qwen3-next|rc=" $OUT/routing.log | grep -E " 32 tokens| 64 tokens|rc=" | cut -c1-220
grep -v Warn $OUT/router_dot.log | tail -n 7
grep -v -E "Warn|^ *$" $OUT/fam_pub.log | tail -n 7
grep -v -E "Warn|^ *$" $OUT/fam_fp8.log | tail -n 7
