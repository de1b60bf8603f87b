#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-05 (nvidia-h200): this session's GPU-facing code, written without a GPU. Its tests:
# per-channel FP8 products as blocks of one row (tests/kernels/test_fp8_linear.py) and per-channel FP8 experts on
# the quantized grouped kernels (tests/kernels/test_quant_moe_path.py), on the GPU as on the interpreter (Ministral
# 3's and Mixtral's GPU tests are in gpu_2026-12-04h/call3.sh). Prints the summary last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 300 python3 -m pytest -v -p no:cacheprovider -n 4 --tb=short -rfE \
  tests/kernels/test_fp8_linear.py tests/kernels/test_quant_moe_path.py tests/layers/test_fused_projection_fp8.py \
  -k "per_channel or fp8_channel" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
sed -i -E 's/\r/\n/g' $OUT/pytest.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log
grep -E " (PASSED|FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 16
