#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01i (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# fp8 weights on the fused residual stack (the quantized product's epilogue, quantized experts readying the next
# norm): their GPU tests, the families in block FP8, V2-Lite's fp8 step by kernel; the warm-up's one-token
# batches after prefixes (engine start-up time, compiles inside timed requests).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-p no:cacheprovider --tb=short -rf -q"
timeout 200 python3 -m pytest $T tests/layers/test_fused_projection_fp8.py tests/kernels/test_fp8_linear.py \
  tests/kernels/test_quant_moe_path.py tests/gpu/test_gpu_deepseek.py > $OUT/logs/t_fp8.log 2>&1
echo "rc=$?" >> $OUT/logs/t_fp8.log
# the warm-up's one-token batches after prefixes: start-up time, and still no compile in timed requests
timeout 200 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp --widened > $OUT/logs/diag_ds.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_ds.log
timeout 260 python3 -m outpace.bench.families --out $OUT/fam --no-verify --quantized fp8 \
  --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
OUTPACE_PDL=0 timeout $(( 580 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/logs deepseek-v2-lite@1 \
  qwen3-next-80b-slice@1 --quantized fp8 > $OUT/logs/tl.log 2>&1
echo "rc=$?" >> $OUT/logs/tl.log
tar czf $OUT/logs.tgz -C $OUT logs fam
echo "== diag"; grep -E "^(timed|warm-up|  step|rc|deepseek)" $OUT/logs/diag_ds.log | cut -c1-300
echo "== tests"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_fp8.log | tail -n 8
echo "== families"; grep -vE "it/s|s/it" $OUT/logs/fam.log | tail -n 14 | cut -c1-200
echo "== tl"; grep -E "kernels and copies|rc=" $OUT/logs/tl.log
