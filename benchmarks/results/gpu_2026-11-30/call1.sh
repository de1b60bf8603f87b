#!/usr/bin/env bash
# Device call 6 (nvidia-h200-x2), prepared, not run (this session's device time was spent): from .snap/ (a git
# archive of HEAD), one GPU each, side by side:
#   GPU 0: the GPU test files call 5 did not finish (DeltaNet step, Gemma fused, fused projections), the
#          quantized MoE kernels' tests; then plain decode of Qwen3.5 and Nemotron-H with run_ahead on and off
#          (run_ahead_cost.py: whether saving their states before a step run ahead costs more than it hides);
#   GPU 1: bench families (bf16) for DeepSeek-V2-Lite, the Step-3.5-Flash slice, Nemotron-H and Gemma-3-12B
#          beside call 4 and call 1 (GatedMLP's fused gating, fb23401, is unmeasured on them); DeepSeek-V2-Lite
#          in block FP8 beside call 3.
# Copy call1/, call3/ and call4/famA, call4/famB into .snap as call1_fam, call3_fam8 (fam8/), call4_famA, call4_famB.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      tests/kernels/test_deltanet_step.py tests/layers/test_gemma_fused.py tests/layers/test_fused_projection.py \
      tests/kernels/test_quant_moe_kernels.py > $OUT/logs/tests.log 2>&1
  echo "tests rc=$?" >> $OUT/logs/tests.log
  timeout $(( 560 - SECONDS )) python3 benchmarks/scripts/run_ahead_cost.py $OUT/logs/run_ahead.json \
      qwen3.5 nemotron-h-8b > $OUT/logs/run_ahead.log 2>&1
  echo "run_ahead rc=$?" >> $OUT/logs/run_ahead.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 330 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 320 \
      --compare-with call4_famA call4_famB call1_fam \
      --shapes deepseek-v2-lite,step-3.5-flash-slice,nemotron-h-8b,gemma-3-12b \
      > $OUT/logs/fam.log 2>&1
  echo "fam rc=$?" >> $OUT/logs/fam.log
  timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam8 --quantized fp8 --no-verify \
      --compare-with call3_fam8 --shapes deepseek-v2-lite > $OUT/logs/fam8.log 2>&1
  echo "fam8 rc=$?" >> $OUT/logs/fam8.log ) &
wait
cp $OUT/fam/families.json $OUT/logs/ 2>/dev/null; cp $OUT/fam8/families.json $OUT/logs/families_fp8.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== tests"; grep -E "passed|failed|FAILED|ERROR|rc=" $OUT/logs/tests.log | tail -n 12
for f in fam fam8; do echo "== $f"; grep -v "%|" $OUT/logs/$f.log | grep -v "^\s*$" | grep -v -i "warn\|legend" | tail -n 18; done
echo "== run_ahead"; grep -E "run_ahead=|rc=" $OUT/logs/run_ahead.log
