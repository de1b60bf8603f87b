#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-03g (nvidia-h200), from the checkout: (1) the absorbed MLA's two decode kernels alone
# under launch settings (mla_decode_parts.py: splits, KV tile x stages, warps, the merge's tiles) at DeepSeek-V2-Lite's
# and V3's shapes, batch 1 and 8 over 512 cached rows; (2) bench families on DeepSeek-V2-Lite, bf16 (the batch-32
# row after 08ea52d's revert of the router's per-token sums).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 380 python3 benchmarks/scripts/mla_decode_parts.py $OUT/mla > $OUT/mla.log 2>&1
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes deepseek-v2-lite > $OUT/fam.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -v Warning $OUT/mla.log | tail -n 75
grep -v Warning $OUT/fam.log | tail -n 8
