#!/bin/bash
# Call 3: how much of a weight row the quantized matmul should prefetch (0 / 256 / 512 / 1024 bytes); MTP on the
# widened Qwen3.5 and DeepSeek with the MTP layer as a fused stack of one (run_layer); the DeepSeek GPU tests.
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 100 python3 benchmarks/scripts/fp8_dequant_variants.py --modes shipped --prefetch-bytes 0 256 512 1024 \
  --out $OUT/prefetch.json > $OUT/logs/prefetch.log 2>&1; tail -16 $OUT/logs/prefetch.log
timeout 200 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp --out $OUT/e2e \
  --workdir .e2e_models > $OUT/logs/e2e_qwen35.log 2>&1; echo "rc=$?"; tail -8 $OUT/logs/e2e_qwen35.log
timeout $(( 520 - SECONDS )) python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e_deepseek.log 2>&1; echo "rc=$?"; tail -8 $OUT/logs/e2e_deepseek.log
timeout $(( 585 - SECONDS )) python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_gpu_deepseek.py \
  > $OUT/logs/t_deepseek.log 2>&1; tail -3 $OUT/logs/t_deepseek.log
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar -czf $OUT/logs.tgz -C $OUT logs
