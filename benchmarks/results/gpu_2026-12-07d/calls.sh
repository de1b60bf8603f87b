#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirty-fourth). Carry the server's wheels (.whl: gpu_2026-12-07/calls.sh)
# and install them first, so the server and grammar tests run rather than skip.
# ARG: suite A|B [WORKERS]: every test marked gpu, in gpu_2026-12-06/call35.sh's two halves (A: the six largest
# files, B: the others), WORKERS pytest workers (default 4: 6 ran out of memory on an H100's 80 GB). -v, so a half
# cut by its limit still says what passed. Under 560 s.
# ARG: hybrid: hybrid-tests, then run_ahead_cost.py on Qwen3.5 alone in what is left of 580 s.
# ARG: hybrid-tests: the GPU tests of hybrid targets that run decode steps ahead (batch-invariant bits of every
# drafter against plain decoding, greedy tokens against the CPU's) after this session's change (a hybrid's recurrent
# state is not saved before a step run ahead: engine/run_ahead.py). Under 300 s.
# ARG: hybrid-cost [before]: benchmarks/scripts/run_ahead_cost.py (plain decode step ms at batch 1 / 8 / 32, run ahead
# on and off) on Qwen3.5 and Nemotron-H-8B; with "before", Qwen3.5 only, the package of cabd505 (the recurrent state
# saved, no step run ahead past 512 MiB of it), carried as .snap_before (git archive cabd505 outpace). Under 560 s.
# ARG: hybrid-rounds: closed batches of the widened Qwen3.5, plain decoding against the adaptive EAGLE3 tree at batch 32,
# temperature 0 and 0.8 (issue 43 item 7: 0.936x at temperature 0.8 in gpu_2026-12-06e, whose batch of 32 did not run
# ahead; one drafter a call: three Qwen3.5 engines do not fit an H100's 80 GB). Under 560 s.
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
hybrid-tests)
  timeout 160 python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider tests/gpu/test_batch_invariant_hybrids_gpu.py \
    > $OUT/hybrid_tests.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/hybrid_tests.log
  timeout $(( 285 - SECONDS )) python3 -m pytest -q -n 3 -m gpu -p no:cacheprovider \
    tests/kernels/test_hybrid_kernels.py tests/gpu/test_gpu.py -k hybrid >> $OUT/hybrid_tests.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/hybrid_tests.log
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|rc=" $OUT/hybrid_tests.log
  ;;
hybrid)
  bash $0 hybrid-tests
  timeout $(( 580 - SECONDS )) python3 benchmarks/scripts/run_ahead_cost.py $OUT/run_ahead_qwen35.json qwen3.5 \
    > $OUT/run_ahead_qwen35.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/run_ahead_qwen35.log
  grep -hE "run_ahead=|rc=|Error" $OUT/run_ahead_qwen35.log
  ;;
hybrid-cost)
  if [ "${2:-}" = before ]; then
    log=$OUT/run_ahead_before.log
    PYTHONPATH=.snap_before timeout 550 python3 benchmarks/scripts/run_ahead_cost.py $OUT/run_ahead_before.json \
      qwen3.5 > $log 2>&1
  else
    log=$OUT/run_ahead_after.log
    timeout 550 python3 benchmarks/scripts/run_ahead_cost.py $OUT/run_ahead_after.json qwen3.5 nemotron-h-8b \
      > $log 2>&1
  fi
  echo "rc=$? after ${SECONDS}s" >> $log
  grep -hE "run_ahead=|rc=|Error" $log
  ;;
hybrid-rounds)
  timeout 550 python3 benchmarks/scripts/closed_batch_rounds.py --family qwen35 --methods eagle3-tree \
    --batches 32 --temperatures 0 0.8 --rounds 3 --max-tokens 64 --workdir /tmp/e2e_qwen35 --out $OUT/rounds.json \
    --steps $OUT/steps.json > $OUT/rounds.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/rounds.log
  sed -i -E 's/\r/\n/g' $OUT/rounds.log
  sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/rounds.log
  grep -E "^(method|none|eagle3)|rc=|Error" $OUT/rounds.log
  ;;
esac
