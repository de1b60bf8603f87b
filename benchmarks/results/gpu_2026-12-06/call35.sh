#!/usr/bin/env bash
# Device call 35 (for a later session with a device; issue 43: "the GPU test files pass on the H200"): every test
# marked gpu (`pytest -m gpu`, 430 in 40 files at 0b726be..HEAD of 2026-12-06), in two halves that each fit one
# call: `bash call35.sh A`, then `bash call35.sh B`. The last whole run was 2026-11-29 (../gpu_tests/); later
# sessions ran only the files they changed. -v: each test's verdict is in the log as it ends, so a half cut by
# its limit still says what passed.
set -u
part=${1:?A or B}
export PYTHONUNBUFFERED=1 PYTHONPATH=. OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# half A: the six largest files (about 220 tests); half B: the others
A="tests/kernels/test_moe_routing.py tests/gpu/test_gpu.py tests/gpu/test_gpu_moe_families.py
  tests/kernels/test_mla_fused.py tests/kernels/test_fp8_linear.py tests/kernels/test_triton_attention.py"
if [ "$part" = A ]; then
  files=$A
else
  files=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider 2>/dev/null | grep "::" | cut -d: -f1 \
    | sort -u | grep -v -x -F -f <(echo $A | tr ' ' '\n'))
fi
timeout 540 python3 -m pytest -v -n 6 -m gpu -p no:cacheprovider --durations 15 $files > $OUT/pytest_$part.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_$part.log
grep -E -c "PASSED" $OUT/pytest_$part.log | sed 's/^/passed lines: /'
grep -E "FAILED|ERROR" $OUT/pytest_$part.log | head -n 30
tail -n 3 $OUT/pytest_$part.log
gzip -k $OUT/pytest_$part.log
