#!/usr/bin/env bash
# Device call 37: the fix of the hybrids' padded prefill (a captured prefill's padding rows NaN made gated
# DeltaNet's step kernel and the chunked scans NaN the state: calls 35 B and the bisect), on the GPU: the failing
# test, the chunked scans' NaN check, and the step kernel's padding test compiled.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 280 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_hybrid_kernels.py::test_hybrid_greedy_tokens_on_the_gpu_equal_the_cpus \
  tests/kernels/test_hybrid_kernels.py::test_chunked_prefill_kernels_match_the_per_token_kernels \
  tests/kernels/test_deltanet_step.py -k "greedy_tokens or chunked_prefill or padding_keeps" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
