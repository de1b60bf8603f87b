#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): call 3 again, the fused kernel's M no
# longer specialized.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 560 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_batch_invariant_gpu.py \
      tests/layers/test_fused_batch_invariant.py tests/gpu/test_fp8_kv_cache_gpu.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 400 python3 benchmarks/scripts/batch_invariant_speed.py --contexts 512 --out $OUT/binv_speed.json \
      > $OUT/logs/speed.log 2>&1
  echo "speed rc=$?" >> $OUT/logs/speed.log ) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; grep -E "passed|failed|FAILED|ERROR|rc=|Error" $OUT/logs/tests.log | tail -n 20
echo "== speed"; grep -v "%|" $OUT/logs/speed.log | tail -n 8
