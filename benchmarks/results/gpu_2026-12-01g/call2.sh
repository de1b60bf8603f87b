#!/bin/bash
# Call 2: the quantized matmul with programmatic dependent launch and its weight's first lines prefetched: its GPU
# tests, its time against the plain launch (fp8_dequant_variants.py f32 / shipped), families in block FP8.
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/kernels/test_fp8_linear.py tests/kernels/test_int4_linear.py > $OUT/logs/quant_tests.log 2>&1; tail -4 $OUT/logs/quant_tests.log
timeout 150 python3 benchmarks/scripts/fp8_dequant_variants.py --modes f32 shipped --out $OUT/variants_pdl.json > $OUT/logs/variants_pdl.log 2>&1; tail -16 $OUT/logs/variants_pdl.log
timeout 280 python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/logs/famQ.log 2>&1; tail -25 $OUT/logs/famQ.log
tar -czf $OUT/logs.tgz -C $OUT logs
