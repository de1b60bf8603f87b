#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirty-fourth). Carry the server's wheels (.whl: gpu_2026-12-07/calls.sh)
# and install them first, so the server and grammar tests run rather than skip.
# ARG: suite A|B [WORKERS]: every test marked gpu, in gpu_2026-12-06/call35.sh's two halves (A: the six largest
# files, B: the others), WORKERS pytest workers (default 4: 6 ran out of memory on an H100's 80 GB). -v, so a half
# cut by its limit still says what passed. Under 560 s.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1 2>/dev/null
case "$1" in
suite)
  part=${2:?A or B}
  A="tests/kernels/test_moe_routing.py tests/gpu/test_gpu.py tests/gpu/test_gpu_moe_families.py
    tests/kernels/test_mla_fused.py tests/kernels/test_fp8_linear.py tests/kernels/test_triton_attention.py"
  if [ "$part" = A ]; then
    files=$A
  else
    files=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider 2>/dev/null | grep "::" | cut -d: -f1 \
      | sort -u | grep -v -x -F -f <(echo $A | tr ' ' '\n'))
  fi
  timeout 550 python3 -m pytest -v -n ${3:-4} -m gpu -p no:cacheprovider --durations 15 $files \
    > $OUT/pytest_$part.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/pytest_$part.log
  grep -E -c "PASSED" $OUT/pytest_$part.log | sed 's/^/passed lines: /'
  grep -E "^(FAILED|ERROR)" $OUT/pytest_$part.log | head -n 30
  tail -n 3 $OUT/pytest_$part.log
  gzip $OUT/pytest_$part.log
  ;;
esac
