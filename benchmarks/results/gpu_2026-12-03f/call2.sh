#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-03f (nvidia-h200): (1) the router logits' per-token sums against the tl.dot path at
# 1..4096 tokens on every routing_timings.py shape (router_logit_paths.py), for per_token_max; (2) the block-FP8 MLA
# down projections' K steps with FP8 widened like bf16 (fp8_widens) on DeepSeek-V2-Lite, and (3) the K steps on
# the DeepSeek-V3 slice in block FP8.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
(cd benchmarks/scripts && PYTHONPATH=../..:. timeout 160 python3 router_logit_paths.py $OUT/router) > $OUT/router.log 2>&1
timeout 180 python3 benchmarks/scripts/decode_settings.py $OUT/mla_down_fp8.json mla_down_fp8 > $OUT/fp8.log 2>&1
timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/mla_down_fp8_v3.json mla_down_fp8_v3 > $OUT/fp8_v3.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -v Warning $OUT/router.log | tail -n 60
grep -v Warning $OUT/fp8.log | tail -n 7
grep -v Warning $OUT/fp8_v3.log | tail -n 5
