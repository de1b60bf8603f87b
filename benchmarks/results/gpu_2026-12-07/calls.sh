#!/usr/bin/env bash
# ARG: features: the GPU tests of decode steps with logits features or grammars captured on first use
# (tests/gpu/test_gpu.py -k first_use), the engine's logprobs, penalties and output-parameter tests on CUDA, then
# what one such request costs its batch, eager against captured (benchmarks/scripts/logits_features_cost.py: the
# widened Llama, batches 8 and 32). Under 590 s.
# ARG: kimi-cut (an 80 GB H100 is enough): issue 43 item 8, the batch-invariant mode's cost on the Kimi-K2 slice cut
# to 1 dense + 1 MoE layer (36 GB; the 3-layer slice needs an H200's memory).
# ARG: hybrid: prefix caching for hybrid targets (recurrent-state checkpoints): the GPU tests of hybrids
# (tests/gpu/test_gpu.py -k hybrid, the batch-invariant hybrid tests), and tests/engine/test_hybrid_prefix_cache.py
# on the GPU (its engines take the device by default: captured decode steps and prefill chunks).
# ARG: prefix-ttft: benchmarks/scripts/shared_prefix_ttft.py on the widened Qwen3.5 (/tmp/e2e_qwen35, as the
# family's closed-batch rounds leave it): 8 requests of a 1024-token shared prefix, cache on and off.
# (``features`` wants xgrammar: carry its wheels, README of the device tool; PYTHONPATH keeps /tmp/site.)
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
case "$1" in
features)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/gpu/test_gpu.py -k first_use \
    > $OUT/gpu_tests.log 2>&1
  OUTPACE_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -n 3 tests/engine/test_logprobs.py \
    tests/engine/test_penalties.py tests/engine/test_output_params.py > $OUT/engine_tests.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/gpu_tests.log $OUT/engine_tests.log
  timeout $(( 580 - SECONDS )) python3 benchmarks/scripts/logits_features_cost.py $OUT/features_cost.json \
    --workdir /tmp/e2e_llama > $OUT/features_cost.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/features_cost.log
  sed -i -E 's/\r/\n/g' $OUT/features_cost.log
  sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/features_cost.log
  tail -16 $OUT/features_cost.log
  ;;
hybrid)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/gpu/test_gpu.py -k hybrid \
    tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/hybrid_gpu_tests.log 2>&1
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 3 tests/engine/test_hybrid_prefix_cache.py \
    > $OUT/hybrid_prefix_tests.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/hybrid_gpu_tests.log $OUT/hybrid_prefix_tests.log
  ;;
prefix-ttft)
  timeout 300 python3 benchmarks/scripts/shared_prefix_ttft.py --workdir /tmp/e2e_qwen35 --out $OUT/prefix_ttft.json \
    > $OUT/prefix_ttft.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/prefix_ttft.log
  sed -i -E 's/\r/\n/g' $OUT/prefix_ttft.log
  grep -vE "(it/s|s/it)\]$" $OUT/prefix_ttft.log | tail -6
  ;;
kimi-cut)
  timeout 400 python3 benchmarks/scripts/batch_invariant_speed.py --shapes kimi-k2-slice --layers 2 --contexts 512 \
    --out $OUT/kimi_invariant_2layers.json > $OUT/kimi_invariant_2layers.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/kimi_invariant_2layers.log
  sed -i -E 's/\r/\n/g' $OUT/kimi_invariant_2layers.log
  sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/kimi_invariant_2layers.log
  tail -12 $OUT/kimi_invariant_2layers.log
  ;;
esac
