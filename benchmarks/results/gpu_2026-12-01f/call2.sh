#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-01f (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# DeepSeek's layers on the fused residual stack (a7dcf6d) and a request that surely ends kept out of the step run
# ahead (3627c49). GPU tests of both, n-gram's closed batch at temperature 0.8 step by step, bench families of
# DeepSeek-V2-Lite, the DeepSeek-V3 slice and the Kimi-K2 slice.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 150 python3 -m pytest $T tests/models/test_deepseek_fused.py tests/kernels/test_mla_fused.py \
  tests/gpu/test_gpu_deepseek.py tests/engine/test_run_ahead_rule.py > $OUT/logs/t_ds.log 2>&1
echo "rc=$?" >> $OUT/logs/t_ds.log
timeout 160 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 --temperatures 0.8 \
  --rounds 3 --workdir /tmp/e2e --out $OUT/rounds.json --steps $OUT/steps.json > $OUT/logs/rounds.log 2>&1
echo "rc=$?" >> $OUT/logs/rounds.log
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 575 - SECONDS )) \
  --shapes deepseek-v2-lite,deepseek-v3-slice,kimi-k2-slice > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_ds.log | tail -n 8
echo "== rounds"; grep -vE "%\||widening" $OUT/logs/rounds.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 14
