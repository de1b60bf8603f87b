#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01j (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the chain probe one draft past the chosen chain (n-gram's closed batches, greedy and at temperature 0.8, five
# interleaved rounds, each step with the chooser's cost of its shape); the fp8 GPU tests the last call's limit cut.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 330 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 --temperatures 0 0.8 \
  --rounds 5 --workdir /tmp/e2e --out $OUT/rounds.json --steps $OUT/steps.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
T="-p no:cacheprovider --tb=short -rf -q"
timeout $(( 585 - SECONDS )) python3 -m pytest $T tests/kernels/test_quant_moe_path.py tests/gpu/test_gpu_deepseek.py \
  > $OUT/logs/t_fp8.log 2>&1
echo "rc=$?" >> $OUT/logs/t_fp8.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== rounds"; grep -vE "it/s|s/it|tensor/s|widening" $OUT/logs/rounds.log | tail -n 12
echo "== tests"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_fp8.log | tail -n 8
