#!/usr/bin/env bash
# ARG: fix-and-kimi (an 80 GB H100 is enough): the batch-invariant hybrid GPU tests after 0ab901a (hybrid prefix
# caching off in batch-invariant mode), then issue 43 item 8 on the Kimi-K2 slice cut to 1 dense + 1 MoE layer, after
# 9e3aa91 (expert stacks built without per-expert copies). Under 590 s.
# ARG: l2: o_proj's weight prefetched into L2 on a side stream while the attention runs (layers/l2_prefetch.py): its
# GPU test (tokens and log-probabilities equal with it off, every fused attention path),
# then decode_settings.py's l2_prefetch sweeps (on against off, batch 1 / 8 / 32 over 512 cached tokens). Under 590 s.
# ARG: l2-parts: decode_settings.py l2_prefetch_parts_llama (why call 2's prefetch lost at Llama-8B's batch 1 and 8).
# ARG: features-eagle3 (carry the server's wheels: gpu_2026-12-07/calls.sh): logits_features_cost.py's adaptive EAGLE3
# rows again after b59d8ee (an eager step of a captured bucket no longer times its shape for the chooser).
# ARG: verify (wheels carried): this session's runner change on CUDA: tests/gpu/test_gpu.py (the captured steps of every
# drafter, first-use captures, grammar steps) and test_cuda_graphs.py's chooser-cost and first-use tests. Under 320 s.
# ARG: grammar (wheels carried): the GPU tests of grammar steps after 535aaef (masks built for the constrained rows
# only, written into the buffer the captured steps read). Under 110 s.
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
ended() {  # a script's log: its exit status and time appended, progress bars' carriage returns and rates dropped
  echo "rc=$? after ${SECONDS}s" >> $1
  sed -i -E 's/\r/\n/g' $1
  sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $1
}
case "$1" in
fix-and-kimi)
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/gpu/test_batch_invariant_hybrids_gpu.py \
    > $OUT/bi_hybrids.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/bi_hybrids.log
  timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py --shapes kimi-k2-slice --layers 2 \
    --contexts 512 --out $OUT/kimi_invariant_2layers.json > $OUT/kimi_invariant_2layers.log 2>&1
  ended $OUT/kimi_invariant_2layers.log
  tail -12 $OUT/kimi_invariant_2layers.log
  ;;
l2)
  timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/gpu/test_l2_prefetch_gpu.py \
    > $OUT/l2_tests.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/l2_tests.log
  timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/l2 l2_prefetch_llama \
    l2_prefetch_v2 l2_prefetch_qwen35 l2_prefetch_gemma3 > $OUT/l2_sweeps.log 2>&1
  ended $OUT/l2_sweeps.log
  grep -E "step ms|shipped|l2_prefetch|rc=|Error" $OUT/l2_sweeps.log | grep -v "^  " | tail -30
  ;;
l2-parts)
  timeout 400 python3 benchmarks/scripts/decode_settings.py $OUT/l2_parts.json l2_prefetch_parts_llama \
    > $OUT/l2_parts.log 2>&1
  ended $OUT/l2_parts.log
  grep -vE "^  " $OUT/l2_parts.log | tail -8
  ;;
features-eagle3)
  timeout 500 python3 benchmarks/scripts/logits_features_cost.py $OUT/features_cost_eagle3.json --methods eagle3 \
    --workdir /tmp/e2e_llama > $OUT/features_cost_eagle3.log 2>&1
  ended $OUT/features_cost_eagle3.log
  tail -10 $OUT/features_cost_eagle3.log
  ;;
verify)
  timeout 300 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/gpu/test_gpu.py \
    > $OUT/gpu_tests.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/gpu_tests.log
  timeout $(( 315 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -n 4 tests/engine/test_cuda_graphs.py \
    -k "eager_steps_of or logits_features or grammar_steps" > $OUT/cuda_graphs_tests.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/cuda_graphs_tests.log
  ;;
grammar)
  timeout 105 python3 -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/gpu/test_gpu.py -k grammar \
    > $OUT/grammar_tests.log 2>&1
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $OUT/grammar_tests.log
  ;;
esac
