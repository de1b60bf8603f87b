#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-03f (nvidia-h200): 957d9e0 (router logits by per-token sums at every count; block-FP8
# MLA down projections over 4 scale columns, widened) on the GPU: (1) the changed kernels' GPU tests; (2) bench
# families, bf16, the MoE shapes; (3) bench families in block FP8, the MLA shapes.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
cd .snap; export PYTHONPATH=.
timeout 210 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=line -rfE tests/kernels/test_moe_routing.py \
  tests/kernels/test_moe_batch_invariant.py tests/kernels/test_mla_fused.py tests/gpu/test_gpu_deepseek.py \
  > $OUT/pytest.log 2>&1
echo "rc=$?" >> $OUT/pytest.log
timeout 200 python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes deepseek-v3-slice,step-3.5-flash-slice,qwen3-next-80b-slice,deepseek-v2-lite > $OUT/fam.log 2>&1
timeout $(( 575 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
  --shapes deepseek-v2-lite,deepseek-v3-slice > $OUT/famQ.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 20
grep -v Warning $OUT/fam.log | tail -n 24
grep -v Warning $OUT/famQ.log | tail -n 12
