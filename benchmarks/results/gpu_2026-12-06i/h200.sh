#!/usr/bin/env bash
# ARG (each under 580 s):
#   kimi (an H200: it needs its memory): issue 43 item 8, the Kimi-K2 slice's batch-invariant cost; then the whole
#        Qwen3-Next-80B-A3B in block FP8 with its MTP layer, step costs by draft count (bench/families.py
#        run_mtp_oracle), no token map;
#   map (an H200): the same MTP run with a random token map of 32,768 tokens; then what ``tests`` runs;
#   tests: the widened Llama's MTP at batch 32 with the 32 x 32 prefill keys (its first step), then the GPU tests of
#        the engine and the prefill graphs (the last session's host copies and keys).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
clean() { sed -i -E 's/\r/\n/g' $1; sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $1; }
mtp_oracle() {  # token map (none or a file), seconds
  local map=(); [ "$1" != none ] && map=(--token-map $1)
  timeout $2 python3 benchmarks/scripts/qwen3next_fp8_mtp_steps.py $OUT/mtp_oracle_$([ "$1" = none ] && echo none \
    || echo map).json "${map[@]}" 2>&1 | grep -E "batch|Error|rror:"
}
llama_mtp_and_tests() {
  OUTPACE_ZOO=$PWD/zoo timeout 300 python3 benchmarks/scripts/closed_batch_rounds.py --methods mtp --batches 32 \
    --temperatures 0 0.8 --rounds 3 --max-tokens 64 --workdir /tmp/e2e_llama --out $OUT/mtp_b32.json \
    --steps $OUT/steps_mtp_b32.json > $OUT/mtp_b32.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/mtp_b32.log
  clean $OUT/mtp_b32.log
  grep -E "^(method|[a-z0-9-]+ +[0-9]+ +0\.[08] )|^  [a-z0-9-]+ +b[0-9]|rc=|Error" $OUT/mtp_b32.log
  timeout $(( 575 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/gpu/test_gpu.py \
    tests/engine/test_engine.py > $OUT/gpu_tests.log 2>&1
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/gpu_tests.log
}
case "$1" in
kimi)
  timeout 200 python3 benchmarks/scripts/batch_invariant_speed.py --shapes kimi-k2-slice --contexts 512 \
    --out $OUT/kimi_invariant.json > $OUT/kimi_invariant.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/kimi_invariant.log
  clean $OUT/kimi_invariant.log
  tail -12 $OUT/kimi_invariant.log
  mtp_oracle none $(( 575 - SECONDS ))
  ;;
map)
  python3 -c "import torch; torch.save(torch.randperm(151936)[:32768].tolist(), '/tmp/map32768.pt')"
  mtp_oracle /tmp/map32768.pt 260
  llama_mtp_and_tests
  ;;
tests)
  llama_mtp_and_tests
  ;;
esac
