#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirty-seventh). Each under 590 s.
# ARG: int4: INT4 K steps in one group of 128 with their scales loaded a step ahead (20271c4 the dense few-row
#      product, 0a2dca8 the grouped experts), first on a GPU: the INT4 GPU tests (dense, experts, fused stack);
#      `bench families --quantized w4a16` on Llama-3.1-8B (gpu_2026-12-07f call 1's figures before); the grouped
#      experts at Qwen3-30B-A3B's shape in groups of 128 (int4_tiles.py --a3b) and int4_library_probe.py on
#      Llama-8B's gate_up and down, each for this package and the one before (.snap_before: git archive 20271c4~1
#      outpace); GemLite's wheel carried in .whl_gl. END=S ends the probes by S seconds (585).
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
both() {  # NAME END SCRIPT ARGS...: the script on this package (GemLite installed) then .snap_before's, done by END s
  local name=$1 end=$2 script=$3; shift 3
  PYTHONPATH=.:/tmp/site timeout $(( (end - SECONDS) / 2 )) python3 $script $OUT/${name}_after.json "$@" \
    > $OUT/${name}_after.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/${name}_after.log
  PYTHONPATH=.snap_before:. timeout $(( end - SECONDS )) python3 $script $OUT/${name}_before.json "$@" \
    > $OUT/${name}_before.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/${name}_before.log
  grep -hvi "warn" $OUT/${name}_after.log $OUT/${name}_before.log | cut -c1-330
}
clean() { sed -i -E 's/\r/\n/g' "$@"; sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' "$@"; }
case "$1" in
int4|int4-short|int4-tests)  # int4-short: without the w4a16 bench (about 420 s with END=420); int4-tests: the
  # GPU tests and the experts' probe alone (about 280 s)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_gl/*.whl
  timeout 150 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/kernels/test_int4_linear.py \
    tests/kernels/test_quant_moe_kernels.py tests/layers/test_quantized_fused_stack.py > $OUT/int4_tests.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/int4_tests.log
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|rc=" $OUT/int4_tests.log
  if [ "$1" = int4 ]; then
    timeout 130 python3 -m outpace.bench.families --out $OUT/w4a16 --no-verify --shapes llama-3.1-8b \
      --quantized w4a16 > $OUT/w4a16.log 2>&1
    echo "rc=$? after ${SECONDS}s" >> $OUT/w4a16.log
    clean $OUT/w4a16.log
    grep -E "^llama|rc=" $OUT/w4a16.log
  fi
  both a3b_experts $(( SECONDS + 120 )) benchmarks/scripts/int4_tiles.py --a3b --tokens 1 8 32
  [ "$1" = int4-tests ] && exit 0
  both probe ${END:-585} benchmarks/scripts/int4_library_probe.py --shapes "llama-8b gate_up" "llama-8b down"
  ;;
esac
