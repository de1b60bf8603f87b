#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-03c (nvidia-h200): Gemma 4's k = v (full attention) layers on the fused q/k/v path
# (4f5e9c9). Runs from .snap (this commit's archive, step_ms.py copied in) and .snap_a (7fcada6's outpace/):
# 1. the GPU tests of the changed path; 2. Gemma 4's captured decode step at b1@512 and b8@512, old and new code
# alternately, twice (gpu_2026-12-03b's step_ms.py); 3. the few-row projection tiles at Gemma 4's raw q/k/v shapes
# and the widened Qwen3.5 MTP's fc; 4. bench families' Gemma 4 row (tokens/s against the floor, kernels a step).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
here=$PWD
(cd .snap && PYTHONPATH=. timeout 150 python3 -m pytest -q tests/layers/test_gemma_fused.py \
  tests/layers/test_fused_projection.py -k "qkv or gemma or cuda" 2>&1 | tail -15 > $OUT/logs/pytest.log)
cat $OUT/logs/pytest.log
for round in 1 2; do
  for snap in .snap_a .snap; do
    (cd $snap && PYTHONPATH=. timeout 100 python3 $here/.snap/step_ms.py "$snap" gemma-4-26b-a4b 2>&1 \
      | grep -E "^STEP|Error" >> $OUT/logs/step_ms.log)
  done
done
cat $OUT/logs/step_ms.log
(cd .snap && PYTHONPATH=. timeout 90 python3 benchmarks/scripts/projection_tiles.py $OUT/tiles.json \
  "gemma-4 sliding qkv" "gemma-4 full qk" "qwen3.5-zoo mtp fc" > $OUT/logs/tiles.log 2>&1)
tail -30 $OUT/logs/tiles.log
left=$((570 - SECONDS))
(cd .snap && PYTHONPATH=. timeout $left python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes gemma-4-26b-a4b > $OUT/logs/fam.log 2>&1)
tail -12 $OUT/logs/fam.log
