#!/usr/bin/env bash
# fp8 q/k/v on the fused stack (commit 0e49477): the GPU test, then bench families --quantized fp8 on SHAPES
# before (the one line reverted in a copy of outpace/) and after, in one process each, and the after-step's
# kernel timeline at batch 1.  Usage: bash fp8_qkv.sh SHAPES [--tests]
set -u
export PYTHONUNBUFFERED=1 OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT /tmp/before
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${2:-}" = --tests ]; then
  PYTHONPATH=. timeout 200 python3 -m pytest -q -n 3 -p no:cacheprovider tests/gpu/test_fp8_fused_stack_gpu.py \
    tests/layers/test_fused_projection_fp8.py > $OUT/pytest.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
  grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
fi
cp -r outpace /tmp/before/
sed -i 's/and fusable_qkv(x, attn.qkv.weight)/and fusable_rows(x, attn.qkv.weight)/' /tmp/before/outpace/layers/fused_decoder.py
grep -c "fusable_rows(x, attn.qkv.weight)" /tmp/before/outpace/layers/fused_decoder.py
PYTHONPATH=.:tests timeout 120 python3 benchmarks/scripts/diag_fp8_fused_error.py 2>&1 | grep -E "from|Error"
for side in before after; do
  root=$PWD; [ $side = before ] && root=/tmp/before
  # (from the copy's root: python -m puts the working directory first on sys.path, before PYTHONPATH)
  (cd $root && PYTHONPATH=. timeout 240 python3 -m outpace.bench.families --out $OUT/fam_$side --no-verify \
    --quantized fp8 --shapes $1 > $OUT/fam_$side.log 2>&1)
  echo "rc=$? after ${SECONDS}s" >> $OUT/fam_$side.log
done
PYTHONPATH=. timeout 120 python3 benchmarks/scripts/step_timeline.py $OUT/tl ${1%%,*}@1 --quantized fp8 --lines 40 \
  > $OUT/timeline.log 2>&1
for f in $OUT/tl/*; do mv "$f" "${f//@/_b}"; done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
for side in before after; do echo "== $side"; grep -E "%|rc=|Error" $OUT/fam_$side.log | tail -n 8; done
grep -E "kernels and copies|span" $OUT/timeline.log
