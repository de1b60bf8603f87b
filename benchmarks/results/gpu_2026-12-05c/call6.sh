#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-05c (written for the next session with a device): two launch changes that are off
# as shipped, each against the shipped path in the decode step. The attention kernels' cache prefetch before the
# dependent launch's wait (prefetch_kv_rows) on the paged kernel (Llama-3.1-8B, Qwen3-30B-A3B) and MLA
# (DeepSeek-V2-Lite); q/k/v with per-head norms in one launch, K split among a head's programs (qkv_split_k), on
# Qwen3-30B-A3B and Gemma-3-12B.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# the split path on CUDA first (these tests are not marked gpu: they take CUDA where it is there)
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/layers/test_fused_projection.py \
  tests/layers/test_gemma_fused.py -k split_k > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
# (each sweep's limit: call 3's took 55-100 s; Gemma 4's qkv_split_k_gemma4 is left for a call of its own)
for s in kv_prefetch_v2:75 kv_prefetch_qwen3:75 kv_prefetch_llama:75 qkv_split_k_qwen3:75 qkv_split_k_gemma3:110; do
  timeout ${s#*:} python3 benchmarks/scripts/decode_settings.py $OUT/${s%:*}.json ${s%:*} >> $OUT/settings.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tail -n 2 $OUT/pytest.log
grep -E "step ms|shipped|prefetch|split|rc=|Error" $OUT/settings.log | grep -v " b[0-9]*@"
