#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03f (nvidia-h200): what 12-03e prepared and did not run. (1) block-FP8 MLA down
# projections' K steps over 1, 2, 4 scale columns on DeepSeek-V2-Lite (decode_settings.py mla_down_fp8); (2) the
# router logits, normal path against per-token sums, at every routing_timings.py shape; (3) batch-invariant mode's
# cost on the shapes not measured since 12-01b.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
timeout 200 python3 benchmarks/scripts/decode_settings.py $OUT/mla_down_fp8.json mla_down_fp8 > $OUT/fp8.log 2>&1
(cd benchmarks/scripts && PYTHONPATH=../..:. timeout 90 python3 invariant_router_logits.py $OUT/router) > $OUT/router.log 2>&1
timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py \
  --shapes llama-3.1-8b,deepseek-v3-slice,gemma-4-26b-a4b,gemma-3-12b --out $OUT/invariant_speed.json > $OUT/speed.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -v Warning $OUT/fp8.log | tail -n 14
grep -v Warning $OUT/router.log | tail -n 40
grep -v Warning $OUT/speed.log | tail -n 12
