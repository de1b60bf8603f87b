#!/usr/bin/env bash
# Device call 30 (issue 43's target of 0.90 of the floor at batch 1 for the Llama-3.1-8B shape; 87.8% in
# gpu_2026-12-02 call 20): where the shape's batch-1 step loses its 12%, kernel by kernel (each kernel's own time,
# OUTPACE_PDL=0) and the shape's bench families row (now a family_shapes.py shape). Sized to follow call 29 in one
# device call (at most 600 s together: `bash .../call29.sh; OUT=$OUT/call30 bash .../call30.sh`).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
OUTPACE_PDL=0 timeout 100 python3 benchmarks/scripts/step_timeline.py $OUT/tl_nopdl llama-3.1-8b@1 --lines 20 \
  > $OUT/tl_nopdl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl_nopdl.log
timeout 130 python3 -m outpace.bench.families --out $OUT/fam --no-verify --shapes llama-3.1-8b > $OUT/fam.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
# each kernel name's time in one step, largest first (without PDL: each kernel's own time)
for t in $OUT/tl_nopdl/*.txt; do
  echo "== $t"
  awk 'NR>2 && $1 != "span" {n[$4]+=1; d[$4]+=$2; s+=$2} END {for (k in n) printf "%9.1f %4d %s\n", d[k], n[k], k; printf "%9.1f total\n", s}' \
    $t | sort -rn | head -n 14
done
tail -n 12 $OUT/fam.log
for f in $OUT/tl_nopdl/*@*; do mv "$f" "${f//@/_}"; done  # ('@' does not come back through $OUT)
gzip $OUT/tl_nopdl/*.txt
