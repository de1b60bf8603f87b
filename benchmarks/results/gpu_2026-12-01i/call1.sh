#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01i (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# ac1314b's routing splits and longer warm-up chunks on the GPU (no compile inside timed requests, engine start-up
# time), the captured zoo decode and every drafter lossless, the Llama-8B step by kernel, V2-Lite's fp8 step.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 200 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp --widened > $OUT/logs/diag_ds.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_ds.log
timeout 300 python3 -m pytest $T tests/gpu/test_gpu.py -k "not eager" > $OUT/logs/t_gpu.log 2>&1
echo "rc=$?" >> $OUT/logs/t_gpu.log
timeout $(( 520 - SECONDS )) python3 -m outpace.bench.profile 8b 1 512 > $OUT/logs/prof8b.log 2>&1
echo "rc=$?" >> $OUT/logs/prof8b.log
OUTPACE_PDL=0 timeout $(( 590 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs deepseek-v2-lite@1 \
  --quantized fp8 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== diag"; grep -E "^(timed|warm-up|  step|rc|deepseek)" $OUT/logs/diag_ds.log | cut -c1-300
echo "== gpu tests"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_gpu.log | tail -n 6
echo "== 8b"; tail -n 40 $OUT/logs/prof8b.log | cut -c1-160
echo "== tl"; tail -n 3 $OUT/logs/tl.log
