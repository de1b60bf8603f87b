#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03b (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# L2 prefetch under PDL of weights that do not wait on the kernel before. The MLA attention and merge under PDL
# (the merge's W_UV loaded before its wait), the few-row projections' and the fused MLA down kernel's prefetch
# budget (layers/pdl.py prefetch_bytes), the shared experts' gate/up rows prefetched while the router runs (moe_kernels.py
# prefetch_shared). First the GPU tests of those kernels, then decode_settings.py's prefetch sweeps: the captured
# decode step with each setting (the ``prefetch_bytes: 0, prefetch_shared: False`` rows: the old prefetch). Gemma's
# sandwich norm kernels under PDL too (not a setting).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadscope -m gpu --tb=short -rfE \
  tests/kernels/test_mla_fused.py tests/kernels/test_mla_kernel.py tests/kernels/test_moe_kernel.py \
  tests/gpu/test_gpu_deepseek.py tests/layers/test_fused_projection.py tests/layers/test_sandwich_norms.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
for sweep in prefetch_v2_lite prefetch_llama prefetch_qwen3_next prefetch_gemma4; do
  left=$((580 - SECONDS)); [ $left -gt 112 ] && left=112
  [ $left -gt 40 ] && timeout $left python3 benchmarks/scripts/decode_settings.py $OUT/logs/$sweep.json $sweep \
    > $OUT/logs/$sweep.log 2>&1
  echo "rc=$?" >> $OUT/logs/$sweep.log
done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
cp $OUT/logs/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | grep -E "^(FAILED|ERROR)|passed|failed|rc=" | tail -n 12
for sweep in prefetch_v2_lite prefetch_llama prefetch_qwen3_next prefetch_gemma4; do
  tar xzf $OUT/logs.tgz -O logs/$sweep.log | tail -n 8
done
