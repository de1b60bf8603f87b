#!/usr/bin/env bash
# Device call 3 (the session's last): GPU tests of the new kernels (four processes side by side), then the seed
# families at their public shapes (after; before_83e3598 holds the before), batch-invariant speed, n-gram e2e.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/logs
t() { name=$1; shift; timeout 170 python3 -m pytest -q -p no:cacheprovider -rf --tb=line "$@" > $OUT/logs/$name.log 2>&1; echo "== $name rc=$?"; grep -E "^(FAILED|ERROR)|^/.*Error|^E |passed|failed" $OUT/logs/$name.log | head -40; }
( t mla tests/kernels/test_mla_fused.py tests/kernels/test_mla_kernel.py ) > $OUT/logs/g1.txt 2>&1 &
( t binv tests/gpu/test_batch_invariant_gpu.py tests/layers/test_batch_invariant.py ) > $OUT/logs/g2.txt 2>&1 &
( t fam tests/layers/test_fused_families.py tests/layers/test_gemma_fused.py; t dnc tests/kernels/test_deltanet_step.py -k compiles ) > $OUT/logs/g3.txt 2>&1 &
( for v in none recurrent moe; do timeout 65 python3 .before/bisect_tree.py $v 2>&1 | grep -E "^bisect|passed|failed|^/.*Error" ; done ) > $OUT/logs/g4.txt 2>&1 &
wait
cat $OUT/logs/g*.txt
timeout 290 python3 -m outpace.bench.families --out $OUT/fam --time-limit 250 --shapes deepseek-v2-lite,qwen3.5,gemma-3-12b 2>&1 | grep -v "it/s\]" | tail -14
timeout 85 python3 benchmarks/scripts/batch_invariant_speed.py --contexts 512 --out $OUT/binv_speed.json 2>&1 | grep -v "it/s\]" | tail -6
tar -czf $OUT/logs.tar.gz -C $OUT logs && rm -rf $OUT/logs
