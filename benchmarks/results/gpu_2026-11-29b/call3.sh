#!/usr/bin/env bash
# Device call 3 (nvidia-h200: the two-GPU kind was no longer lent), from .snap/ (a git archive of HEAD): the
# last of the session's device time. The GPU checks of the new code (two pytest processes side by side), then
# the families bench over the shapes this session's fixes touched, then batch-invariant mode's cost.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
PYTEST=(python3 -m pytest -q -p no:cacheprovider --tb=line -rf --timeout 90 -k "not bandwidth")
timeout 110 "${PYTEST[@]}" tests/gpu/test_fp8_kv_cache_gpu.py tests/kernels/test_fp8_linear.py \
    tests/kernels/test_int4_linear.py tests/kernels/test_quant_moe_path.py > $OUT/logs/tests_a.log 2>&1 &
timeout 110 "${PYTEST[@]}" tests/gpu/test_batch_invariant_gpu.py tests/layers/test_fused_batch_invariant.py \
    tests/kernels/test_family_routers.py tests/layers/test_hybrid_attention_kernels.py tests/layers/test_fused_ops.py \
    > $OUT/logs/tests_b.log 2>&1 &
wait
timeout 280 python3 -m outpace.bench.families --out $OUT/fam --time-limit 900 \
    --shapes qwen3.5,gemma-4-26b-a4b,nemotron-h-8b,step-3.5-flash-slice,deepseek-v2-lite > $OUT/logs/fam.log 2>&1
echo "fam rc=$?" >> $OUT/logs/fam.log
timeout 60 python3 benchmarks/scripts/batch_invariant_speed.py --contexts 512 --out $OUT/batch_invariant.json \
    > $OUT/logs/binv.log 2>&1; echo "binv rc=$?" >> $OUT/logs/binv.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -h "FAILED\|passed\|failed" $OUT/logs/tests_a.log $OUT/logs/tests_b.log | head -30
grep -v "%|" $OUT/logs/fam.log | grep -A30 "^shape" | head -30; tail -n 1 $OUT/logs/fam.log
grep -v "%|" $OUT/logs/binv.log | tail -n 6
