#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: why batch-invariant mode on the fused path lost bit-identity (diag_batch_invariant_fused.py: one
#          configuration a process: which parts are fused, PDL, graphs, run-ahead); then bench families for the
#          hybrids with run_ahead's new default (off on hybrids) beside call 4 / call 1 of gpu_2026-11-29f;
#   GPU 1: bench e2e --family qwen35 at batch 1 and 32 (plain and MTP now without running ahead).
# Copy gpu_2026-11-29f's call1/ and call4/famA, call4/famB into .snap as call1_fam, call4_famA, call4_famB.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  D=benchmarks/scripts/diag_batch_invariant_fused.py
  for cfg in "none 1 1" "all 1 1" "all 1 0" "all 0 0" "head_mlp 1 1"; do
    timeout 120 python3 $D $cfg >> $OUT/logs/binv.log 2>&1 || echo "rc=$? for $cfg" >> $OUT/logs/binv.log
  done
  OUTPACE_PDL=0 timeout 120 python3 $D all 1 1 >> $OUT/logs/binv.log 2>&1 || echo "rc=$? for pdl0" >> $OUT/logs/binv.log
  timeout $(( 570 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
      --compare-with call4_famA call4_famB call1_fam \
      --shapes qwen3.5,nemotron-h-8b,qwen3-next-80b-slice > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 560 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 32 \
      --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null; cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== binv"; grep -E "parts=|rc=|Error|error" $OUT/logs/binv.log | tail -n 20
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -v "^\s*$" | grep -v -i "warn\|legend" | tail -n 14
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 22
