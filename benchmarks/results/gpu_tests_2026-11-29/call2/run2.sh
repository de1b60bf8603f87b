#!/usr/bin/env bash
# Device call 2: the new family kernels' tests on the GPU, three pytest processes side by side (each file's
# summary printed; full logs with the printed timings under $OUT).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t() { name=$1; shift; timeout ${T:-330} python3 -m pytest -q -s -p no:cacheprovider -rf --tb=short "$@" > $OUT/$name.log 2>&1; echo "== $name rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$name.log | tail -12; }
( t moe tests/kernels/test_moe_kernel.py tests/kernels/test_moe_routing.py; t gpu_moe tests/gpu/test_gpu_deepseek.py tests/gpu/test_gpu_moe_families.py ) > $OUT/g1.txt 2>&1 &
( t deltanet tests/kernels/test_deltanet_step.py; t mamba tests/kernels/test_mamba2_step.py; t hybrid tests/kernels/test_hybrid_kernels.py ) > $OUT/g2.txt 2>&1 &
( t mla tests/kernels/test_mla_fused.py tests/kernels/test_mla_kernel.py; t fused_fam tests/layers/test_fused_families.py tests/layers/test_gemma_fused.py ) > $OUT/g3.txt 2>&1 &
wait
cat $OUT/g1.txt $OUT/g2.txt $OUT/g3.txt
grep -hE "µs|us per|eager .* fused|fused .* eager|launches" $OUT/*.log | head -40
