#!/usr/bin/env bash
# Device call 25: the GPU tests written after gpu_2026-12-05g's call 22 and never run on CUDA: MTP drafting past
# its layers (tests/speculative/test_mtp_past_the_chain.py's CUDA cases) and later prefill chunks absorbed as
# captured (tests/gpu/test_gpu.py's prefill-chunk and absorb tests).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 -m pytest -n 4 -q tests/speculative/test_mtp_past_the_chain.py tests/gpu/test_gpu.py \
  -k "prefill_chunks or absorb or past_the_chain" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
tail -n 25 $OUT/pytest.log
