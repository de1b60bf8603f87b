#!/usr/bin/env bash
# Device call 13 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# NOT RUN this session (its device time was spent): Mamba2's step kernels under PDL with the norm kernel back at
# 4 warps and its in-place window copy behind a barrier (c4fb671): their GPU tests, the hybrids' batch-invariant
# GPU tests (gated DeltaNet's joined reductions, c2d4a2c), then Nemotron-H-8B's decode in bench families
# (before: 224.2 tok/s, 80.9% / 1509.2 / 4145.4 at batch 1 / 8 / 32, 177 kernels, gpu_2026-12-01d call 4) and its
# batch-1 step kernel by kernel.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -m gpu tests/kernels/test_mamba2_step.py \
  tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout $((420 - SECONDS)) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --time-limit $((400 - SECONDS)) --shapes nemotron-h-8b > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
left=$((560 - SECONDS)); [ $left -lt 30 ] && left=30
timeout $left python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl nemotron-h-8b@1 > $OUT/logs/tl/step.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 3
tar xzf $OUT/logs.tgz -O logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|rc=|Error" | tail -n 6
