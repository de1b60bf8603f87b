#!/usr/bin/env bash
# For the next session with a device (written 2026-12-06, not yet run): the GPU tests of this session's fused-stack
# changes (fp8 q/k/v and Gemma's through the quantized product, GELU-tanh gated in its store, INT4 projections
# packed and on the fused stack), then the batch-1 step's kernel count and span of the shapes they touch, and
# bench families in fp8 (Gemma-3-12B) and w4a16 (Llama-3.1-8B, Gemma-3-12B) beside bf16. About 500 s.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -n 3 -p no:cacheprovider tests/gpu/test_fp8_fused_stack_gpu.py \
  tests/kernels/test_fp8_linear.py tests/kernels/test_int4_linear.py tests/layers/test_fused_projection_fp8.py \
  tests/layers/test_quantized_fused_stack.py tests/layers/test_gemma_fused.py tests/kernels/test_quant_moe_kernels.py \
  > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
for q in "" "--quantized fp8" "--quantized w4a16"; do
  timeout 100 python3 benchmarks/scripts/step_timeline.py $OUT/tl gemma-3-12b@1 llama-3.1-8b@1 --lines 2 $q 2>&1 \
    | grep -E "kernels and|span|Error|^[a-z0-9.-]+( \([a-z0-9-]+\))?$" | tee -a $OUT/timeline.log
done
for q in fp8 w4a16; do
  timeout $(( (560 - SECONDS) / 2 )) python3 -m outpace.bench.families --out $OUT/fam_$q --no-verify --quantized $q \
    --shapes gemma-3-12b$([ $q = w4a16 ] && echo ,llama-3.1-8b) > $OUT/fam_$q.log 2>&1
  echo "rc=$?" >> $OUT/fam_$q.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "%|rc=|Error" $OUT/fam_*.log | tail -n 12
