#!/usr/bin/env bash
# Device call 9 (gpu_2026-12-05d): the split merge in the attention kernel (merge_splits_in_kernel, new), the gate/up
# kernel's 16-column few-token tiles (new), and the two launch changes gpu_2026-12-05c's call 6 left unrun
# (prefetch_kv_rows, qkv_split_k), each against the shipped path in the decode step; first their tests on CUDA.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# (not marked gpu: these take CUDA where it is there)
timeout 80 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/kernels/test_split_merge.py \
  tests/layers/test_fused_projection.py tests/layers/test_gemma_fused.py -k "split_k or merge" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
for s in merge_in_kernel_qwen3:70 merge_in_kernel_llama:70 gate_up_n16_qwen3:70 gate_up_n16_gemma4:70 \
    kv_prefetch_qwen3:70 qkv_split_k_qwen3:70 kv_prefetch_llama:70; do
  timeout ${s#*:} python3 benchmarks/scripts/decode_settings.py $OUT/${s%:*}.json ${s%:*} >> $OUT/settings.log 2>&1
  echo "rc=$? ${s%:*} after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tail -n 2 $OUT/pytest.log
grep -E "step ms|shipped|prefetch|split|merge|rc=|Error" $OUT/settings.log | grep -v " b[0-9]*@"
