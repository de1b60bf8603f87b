#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01b (nvidia-h200, one GPU), from .snap/ (a git archive of HEAD): Gemma 4 with its
# dense MLP fused into the grouped experts (bacfae0): families bench and step timeline; batch-invariant MLA with
# 16-row tiles for V2-Lite (27ee0ae) over the mode's split rows; the GPU tests of both.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 150 python3 -m outpace.bench.families --out $OUT/fam --no-verify --shapes gemma-4-26b-a4b \
  > $OUT/logs/fam.log 2>&1
echo "fam rc=$?" >> $OUT/logs/fam.log
timeout 150 python3 benchmarks/scripts/batch_invariant_speed.py --out $OUT/bi_v2lite.json \
  --shapes deepseek-v2-lite --split-rows 128 64 32 > $OUT/logs/bi.log 2>&1
echo "bi rc=$?" >> $OUT/logs/bi.log
timeout 170 python3 -m pytest -v -p no:cacheprovider tests/kernels/test_mla_fused_invariant.py \
  tests/kernels/test_family_routers.py tests/layers/test_gemma_fused.py \
  tests/gpu/test_gpu_moe_families.py -k "gemma or chains" > $OUT/logs/tests.log 2>&1
echo "tests rc=$?" >> $OUT/logs/tests.log
timeout 50 python3 benchmarks/scripts/step_timeline.py $OUT/logs gemma-4-26b-a4b@1 --lines 0 \
  > $OUT/logs/timeline.log 2>&1
echo "timeline rc=$?" >> $OUT/logs/timeline.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/fam.log | grep -E "tok|kernel|batch|rc=|Error" | tail -n 12
grep -E "against|rc=|Error" $OUT/logs/bi.log | tail -n 10
grep -E "passed|failed|rc=|FAILED|Error" $OUT/logs/tests.log | tail -n 12
tail -n 2 $OUT/logs/timeline.log
