#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01c (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD): after the
# restored closed-batch quantile and the decode step's fewer launches (f4c6085, and the sampling flags and
# token view after it):
# - the captured zoo decode's GPU tests (every step a replay; drafters lossless in fp32 with graphs);
# - closed_batch_rounds.py (none / ngram / draft, batch 8 and 32, temperature 0 and 0.8, 5 rounds);
# - bench families: Gemma-3-12B, Nemotron-H-8B, DeepSeek-V2-Lite, Qwen3-Next slice (b1 / 8 / 32, kernels a step).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
cd .snap; export PYTHONPATH=.
timeout 110 python3 -m pytest -v tests/gpu/test_gpu.py -k "replays or (lossless and graphs and (mtp or eagle3-chain or draft))" \
  > $OUT/logs/tests.log 2>&1
echo "rc=$?" >> $OUT/logs/tests.log
timeout 190 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram draft --batches 8 32 \
  --rounds 5 --workdir .e2e --out $OUT/rounds.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
timeout 250 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 240 \
  --shapes qwen3-next-80b-slice,nemotron-h-8b,gemma-3-12b,deepseek-v2-lite > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
cd $OUT && tar czf logs.tgz logs
grep -E "passed|failed|rc=" logs/tests.log | tail -n 3; grep -v "%|" logs/rounds.log | tail -n 14
grep -v "%|" logs/fam.log | tail -n 22
rm -rf logs
