#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-03g (nvidia-h200), from the checkout (the commit holding this script) and .snap_a
# (549fb9f: the launch before it, a git archive): (1) the changed kernels' GPU tests (one token's routing layout
# from registers; the MLA attention at 64-row KV tiles and 8 warps); (2) the MLA tile alone in V2-Lite's step
# (decode_settings.py mla_tile); (3) bench families, DeepSeek-V2-Lite, Gemma 4 and the Qwen3-Next slice, then
# V2-Lite at 549fb9f on the same machine.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=line -rfE -m gpu tests/kernels/test_moe_routing.py \
  tests/kernels/test_mla_kernel.py tests/kernels/test_mla_fused.py tests/kernels/test_moe_kernel.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 100 python3 benchmarks/scripts/decode_settings.py $OUT/mla_tile.json mla_tile > $OUT/tile.log 2>&1
timeout 230 python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes deepseek-v2-lite,gemma-4-26b-a4b,qwen3-next-80b-slice > $OUT/fam.log 2>&1
(cd .snap_a && timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famA --no-verify \
  --shapes deepseek-v2-lite) > $OUT/famA.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
grep -v Warning $OUT/tile.log | tail -n 8
grep -v Warning $OUT/fam.log | tail -n 16
grep -v Warning $OUT/famA.log | tail -n 6
