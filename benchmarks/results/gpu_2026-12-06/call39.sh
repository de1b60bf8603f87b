#!/usr/bin/env bash
# Device call 39: row streams (one row's product in a few whole weight rows a program, K unsplit; fp8 weights and
# plain ones up to fused_projection.one_row_plain_max_values): (1) the GPU tests of the changed products; (2)
# cuda_gemv_probe.py with ours before / shipped / the best row-stream tiles, and Triton's rows with PDL (its
# compile error of call 38 fixed); (3) the decode step at batch 1, shipped against the rules before, a shape a
# sweep, the most telling first (decode_settings.py row_streams_*; each JSON written as it ends).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -n 3 -p no:cacheprovider tests/layers/test_row_streams.py \
  tests/layers/test_fused_projection.py tests/kernels/test_fp8_linear.py tests/layers/test_fused_projection_fp8.py \
  tests/layers/test_gemma_fused.py tests/gpu/test_gpu_deepseek.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
timeout 170 python3 benchmarks/scripts/cuda_gemv_probe.py $OUT/cuda_gemv_probe.json > $OUT/probe.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/probe.log
grep -v '^{' $OUT/probe.log | grep -v "^    " | tail -n 24
timeout $((560 - SECONDS)) python3 benchmarks/scripts/decode_settings.py $OUT/sweeps row_streams_v2 row_streams_qwen3 \
  row_streams_v2_fp8 row_streams_qwen3next_fp8 row_streams_llama row_streams_gemma3 row_streams_step_fp8 \
  > $OUT/settings.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
sed -i -E 's/\r/\n/g' $OUT/settings.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/settings.log
grep -E "step ms|^ *[0-9.]+  |rc=|Error" $OUT/settings.log | tail -n 30
