#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01d (nvidia-h200), from .snap/ (a git archive of HEAD): after 302ea4a (Gemma 3's
# input norms readied by the previous layer's last add; Nemotron-H's relu2 in up_proj's kernel).
#   The fused projection / Gemma / hybrid test files on CUDA; bench families Gemma-3-12B and Nemotron-H-8B
#   (kernels a step, share of the floor); run_ahead_cost.py for Nemotron-H-8B and Qwen3.5 (plain decode with
#   and without running ahead: is MAX_SAVED_BYTES still right now that the saves are foreach copies?).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 150 python3 -m pytest $T tests/layers/test_fused_projection.py tests/layers/test_gemma_fused.py \
  tests/models/test_hybrid_fused.py > $OUT/logs/t_fused.log 2>&1
echo "rc=$?" >> $OUT/logs/t_fused.log
timeout 170 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 160 \
  --shapes gemma-3-12b,nemotron-h-8b > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 585 - SECONDS )) python3 benchmarks/scripts/run_ahead_cost.py $OUT/run_ahead.json nemotron-h-8b qwen3.5 \
  > $OUT/logs/run_ahead.log 2>&1
echo "rc=$?" >> $OUT/logs/run_ahead.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_fused"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_fused.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=" | tail -n 10
echo "== run_ahead"; grep -E "run_ahead=|rc=|Error" $OUT/logs/run_ahead.log | tail -n 6
