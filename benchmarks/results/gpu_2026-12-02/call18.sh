#!/usr/bin/env bash
# Device call 18 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# 04e01a4 (a greedy step's verdict from the target's head in one launch) under the GPU tests: the head's argmax
# against its logits (tests/layers/test_head_argmax.py), every zoo drafter lossless in fp32 with graphs
# (tests/gpu/test_gpu.py), batch-invariant mode's bit-identical greedy outputs; then the few-row SwiGLU's
# sub-tiles and K step inside the captured decode step (call 17: Llama-8B's gate/up alone 3.2% faster in sub-tiles
# of 64 at BK 128): decode_settings.py's swiglu sweeps on the Llama-3.1-8B shape and Qwen3.5, batch 1 and 8 over
# 512 cached tokens.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/layers/test_head_argmax.py \
  tests/gpu/test_gpu.py tests/gpu/test_batch_invariant_gpu.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
for s in swiglu_llama swiglu_qwen35; do
  left=$((575 - SECONDS))
  [ $left -gt 60 ] && timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/logs/$s.json $s \
    > $OUT/logs/$s.log 2>&1
  echo "rc=$?" >> $OUT/logs/$s.log
done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | grep -E "passed|failed|FAILED|rc=" | tail -n 8
for s in swiglu_llama swiglu_qwen35; do
  tar xzf $OUT/logs.tgz -O logs/$s.log | grep -v "^  {\|^  shipped" | tail -n 8
done
