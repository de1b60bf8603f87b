#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirty-sixth). Each under 590 s.
# ARG: w4a16: issue 44's INT4 projections on the GPU (`--quantized w4a16`: every decoder projection INT4, RedHatAI's
#      and Gemma QAT's layout), never timed before: the GPU tests of the INT4 kernels and the fused stack over them,
#      then `bench families` on Llama-3.1-8B and Gemma-3-12B in bf16 and in w4a16 (decode against each floor).
# ARG: rounds FAMILY METHOD [FAMILY METHOD]: issue 43 item 7, the widened families' drafters not yet run in closed
#      batches (`closed_batch_rounds.py`, batch 8 and 32, temperature 0 and 0.8, three interleaved rounds of 64
#      tokens), one family's engines at a time (an H100's 80 GB), its widened folder cleared after.
# ARG: int4: after 20271c4 (INT4 group scales a step ahead): the INT4 GPU tests; `bench families --quantized w4a16` on
#      Llama-3.1-8B (call 1's figures before); int4_library_probe.py on Llama-8B's projections, this package and the
#      one before the change (.snap_before: git archive 20271c4~1 outpace), GemLite's wheel carried in .whl_gl.
# ARG: int4-short: the same in under 170 s: the INT4 kernel tests, the probe on gate_up and down only, no bench.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
probes() {  # END SHAPE...: int4_library_probe.py on these shapes, this package (GemLite installed) then .snap_before's,
  local end=$1; shift  # both done by END seconds
  PYTHONPATH=.:/tmp/site timeout $(( (SECONDS + end) / 2 - SECONDS )) python3 \
    benchmarks/scripts/int4_library_probe.py $OUT/probe_after.json --shapes "$@" > $OUT/probe_after.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/probe_after.log
  PYTHONPATH=.snap_before:. timeout $(( end - SECONDS )) python3 benchmarks/scripts/int4_library_probe.py \
    $OUT/probe_before.json --shapes "$@" > $OUT/probe_before.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/probe_before.log
  grep -hvi "warn" $OUT/probe_after.log $OUT/probe_before.log | cut -c1-330
}
clean() { sed -i -E 's/\r/\n/g' "$@"; sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' "$@"; }
case "$1" in
w4a16)
  timeout 170 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/kernels/test_int4_linear.py \
    tests/layers/test_quantized_fused_stack.py tests/layers/test_gemma_fused.py > $OUT/int4_tests.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/int4_tests.log
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|rc=" $OUT/int4_tests.log
  shapes=llama-3.1-8b,gemma-3-12b
  timeout $(( 380 - SECONDS )) python3 -m outpace.bench.families --out $OUT/bf16 --no-verify --shapes $shapes \
    --time-limit $(( 340 - SECONDS )) > $OUT/bf16.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/bf16.log
  timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/w4a16 --no-verify --shapes $shapes \
    --quantized w4a16 --compare-with $OUT/bf16 --time-limit $(( 560 - SECONDS )) > $OUT/w4a16.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/w4a16.log
  clean $OUT/bf16.log $OUT/w4a16.log
  tail -n 14 $OUT/w4a16.log
  ;;
int4)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_gl/*.whl
  timeout 100 python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider tests/kernels/test_int4_linear.py \
    tests/layers/test_quantized_fused_stack.py > $OUT/int4_tests.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/int4_tests.log
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|rc=" $OUT/int4_tests.log
  timeout 120 python3 -m outpace.bench.families --out $OUT/w4a16 --no-verify --shapes llama-3.1-8b --quantized w4a16 \
    > $OUT/w4a16.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/w4a16.log
  clean $OUT/w4a16.log
  grep -E "^llama|rc=" $OUT/w4a16.log
  probes 580 "llama-8b gate_up" "llama-8b down" "llama-8b qkv" "llama-8b o"
  ;;
int4-short)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_gl/*.whl
  timeout 60 python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider tests/kernels/test_int4_linear.py \
    > $OUT/int4_tests.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/int4_tests.log
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|rc=" $OUT/int4_tests.log
  probes 165 "llama-8b gate_up" "llama-8b down"
  ;;
rounds)
  shift
  while [ $# -ge 2 ]; do
    family=$1 method=$2; shift 2
    label=${family}_$method
    timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/closed_batch_rounds.py --family $family --methods $method \
      --batches 8 32 --temperatures 0 0.8 --rounds 3 --max-tokens 64 --workdir /tmp/e2e_$family \
      --out $OUT/$label.json --steps $OUT/steps_$label.json > $OUT/$label.log 2>&1
    echo "rc=$? after ${SECONDS}s" >> $OUT/$label.log
    rm -rf /tmp/e2e_$family
    clean $OUT/$label.log
    echo "== $label"; grep -E "^(method|[a-z0-9-]+ +[0-9]+ +0\.[08] )|rc=|Error" $OUT/$label.log
  done
  ;;
esac
