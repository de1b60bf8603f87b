#!/bin/bash
# Call 1: the fp8 weight tile's conversion variants (benchmarks/scripts/fp8_dequant_variants.py); the gated
# attention GPU tests at their new tolerance; the DeepSeek GPU tests.
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/logs/gpu.txt
timeout 330 python3 benchmarks/scripts/fp8_dequant_variants.py --out $OUT/variants.json 2>&1 | tee $OUT/logs/variants.log | tail -40
timeout 60 python3 -m pytest -v -p no:cacheprovider --tb=short -rf tests/kernels/test_gated_attention.py -k "cuda or gpu or bf16" > $OUT/logs/gated.log 2>&1; tail -5 $OUT/logs/gated.log
timeout 150 python3 -m pytest -v -p no:cacheprovider --tb=short -rf tests/gpu/test_gpu_deepseek.py > $OUT/logs/deepseek.log 2>&1; tail -8 $OUT/logs/deepseek.log
tar -czf $OUT/logs.tgz -C $OUT logs
