#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-04 (nvidia-h200), from the checkout (a6812aa's code: one row on the CUDA cores for
# block-FP8 experts and fp8 weights of at most 4096 columns) and .snap_a (ad7be0e, the session's start: a git
# archive): (1) the changed kernels' GPU tests; (2) bench families in block FP8, DeepSeek-V2-Lite and the Qwen3-Next
# slice, then V2-Lite at ad7be0e on the same machine.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=line -rfE tests/kernels/test_fp8_linear.py \
  tests/kernels/test_quant_moe_kernels.py tests/kernels/test_moe_kernel.py tests/kernels/test_quant_moe_path.py \
  tests/kernels/test_moe_batch_invariant.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 250 python3 -m outpace.bench.families --out $OUT/fam --no-verify --quantized fp8 \
  --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/fam.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam.log
(cd .snap_a && timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famA --no-verify \
  --quantized fp8 --shapes deepseek-v2-lite) > $OUT/famA.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/famA.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log fam.log famA.log $(cd $OUT && find fam famA -name "*.json" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
grep -v Warning $OUT/fam.log | tail -n 14
grep -v Warning $OUT/famA.log | tail -n 7
