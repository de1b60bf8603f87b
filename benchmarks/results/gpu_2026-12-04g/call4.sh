#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04g (nvidia-h200): the GPU test files of tests/gpu/ on main (the session changed no
# shipped kernel after 4208916's routing layout, which call 2 ran), -v so that a cut run still shows each result.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 420 python3 -m pytest -v -p no:cacheprovider -n 4 --tb=short -rfE tests/gpu/test_gpu.py \
  tests/gpu/test_gpu_deepseek.py tests/gpu/test_fp8_kv_cache_gpu.py tests/gpu/test_batch_invariant_gpu.py \
  tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/pytest.log 2>&1
rc=$?; echo "rc=$rc after ${SECONDS}s" >> $OUT/pytest.log
sed -i -E 's/\r/\n/g' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT pytest.log
grep -cE " PASSED" $OUT/pytest.log
grep -E " (FAILED|ERROR)|^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 15
