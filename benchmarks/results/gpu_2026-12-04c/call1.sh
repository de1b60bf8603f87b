#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-04c (nvidia-h200): a few tokens' pairs apart (moe_kernels.py PAIRS APART): (1) GPU
# tests of the grouped kernels; (2) the grouped experts alone at 1-8 tokens with pairs apart on (4) and off (0);
# (3) decode_settings.py pairs_apart sweeps (V2-Lite, Qwen3-Next slice, Step-3.5 slice in block FP8; Kimi slice INT4).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_quant_moe_kernels.py \
  tests/kernels/test_quant_moe_path.py tests/kernels/test_moe_kernel.py tests/kernels/test_moe_batch_invariant.py \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
QK='from outpace.bench.quant_kernels import report_moe
from outpace.layers import moe_kernels as mk
for apart in (4, 0):
    mk.pairs_apart_max_tokens = apart
    print("pairs_apart_max_tokens", apart)
    report_moe(tokens=(1, 2, 3, 4, 8))'
timeout 90 python3 -c "$QK" > $OUT/qk.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/qk.log
for s in v2_fp8 qwen3next_fp8 kimi_int4 step_fp8; do
  left=$(( 585 - SECONDS ))
  [ $left -lt 30 ] && break
  timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/pairs_apart_$s.json pairs_apart_$s > $OUT/ds_$s.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/ds_$s.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
grep -v Warn $OUT/qk.log | tail -n 16 | cut -c1-80
for f in $OUT/ds_*.log; do grep -v Warn $f | tail -n 6; done
