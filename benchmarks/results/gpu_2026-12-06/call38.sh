#!/usr/bin/env bash
# Device call 38 (for the next session with a device): (1) the hybrid padding fix of 47f7d60 on the GPU (call 37
# still failed at 13dc79c): the failing test and the recurrent kernels' padding tests; (2) cuda_gemv_probe.py again,
# now with the CUDA kernels' structure written in Triton beside them (issue 43/44's batch-1 products).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_hybrid_kernels.py::test_hybrid_greedy_tokens_on_the_gpu_equal_the_cpus \
  tests/kernels/test_hybrid_kernels.py::test_chunked_prefill_kernels_match_the_per_token_kernels \
  tests/kernels/test_deltanet_step.py tests/kernels/test_mamba2_step.py -k "greedy_tokens or chunked_prefill or padding" \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
timeout 300 python3 benchmarks/scripts/cuda_gemv_probe.py $OUT/cuda_gemv_probe.json > $OUT/probe.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/probe.log
grep -v '^{' $OUT/probe.log | tail -n 16
