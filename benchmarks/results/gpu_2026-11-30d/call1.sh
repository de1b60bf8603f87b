#!/usr/bin/env bash
# Device call 1 (nvidia-h200-x2), from .snap/ (a git archive of HEAD 5ce2669), one GPU each, side by side:
#   GPU 0: the MLA kernel files (the split merge of d5758d0 and the batch-invariant tree walk had not run on the
#          GPU against a reference), the MoE batch-invariant kernels; step timelines at batch 1 of the MoE shapes
#          furthest from the floor; bench families for Qwen3.5 and Nemotron-H at HEAD (unmeasured since the
#          attention merge was reverted), beside gpu_2026-11-30c call 4 (c4famB).
#   GPU 1: the hybrids' batch-invariant GPU tests, the MoE families' GPU tests, bench e2e --family qwen35 at
#          batch 1 and 32.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  for t in tests/kernels/test_mla_kernel.py tests/kernels/test_mla_fused.py tests/kernels/test_moe_batch_invariant.py; do
    n=$(basename $t .py)
    timeout 150 python3 -m pytest -q $t > $OUT/logs/$n.log 2>&1; echo "$n rc=$?" >> $OUT/logs/$n.log
  done
  timeout 120 python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl deepseek-v2-lite@1 \
      qwen3-next-80b-slice@1 gemma-4-26b-a4b@1 step-3.5-flash-slice@1 --lines 0 > $OUT/logs/tl.log 2>&1
  echo "tl rc=$?" >> $OUT/logs/tl.log
  timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famB --no-verify --compare-with c4famB \
      --shapes qwen3.5,nemotron-h-8b > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log ) &
( export CUDA_VISIBLE_DEVICES=1
  for t in tests/gpu/test_batch_invariant_hybrids_gpu.py tests/gpu/test_gpu_moe_families.py; do
    n=$(basename $t .py)
    timeout 140 python3 -m pytest -q $t > $OUT/logs/$n.log 2>&1; echo "$n rc=$?" >> $OUT/logs/$n.log
  done
  timeout $(( 560 - SECONDS )) python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 32 \
      --methods none mtp eagle3 --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
cp $OUT/famB/families.json $OUT/logs/familiesB.json 2>/dev/null; cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
for n in test_mla_kernel test_mla_fused test_moe_batch_invariant test_batch_invariant_hybrids_gpu test_gpu_moe_families; do
  echo "== $n"; grep -E "passed|failed|error|rc=" $OUT/logs/$n.log | tail -n 3; done
echo "== tl"; grep -E "kernels and|Error|rc=" $OUT/logs/tl.log | tail -n 6
echo "== famB"; grep -v "%|" $OUT/logs/famB.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 8
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 12
