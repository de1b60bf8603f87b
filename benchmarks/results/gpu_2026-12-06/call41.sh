#!/usr/bin/env bash
# Device call 41 (written for the next session with a device): (1) the widened families' bf16 test (now: tokens may
# part only at near ties of the float32 zoo's logits) and the fp8 row streams' tests on the GPU; (2) the fp8 row
# streams alone against the one-row / wide tiles in the decode step at batch 1 and 8 (call 40 timed them with a bf16
# twin, since removed); (3) bench families --quantized fp8 on DeepSeek-V2-Lite and the Qwen3-Next slice (issue 44's
# batch-1 floors, 35.5% and 46.0% in gpu_2026-12-04e call 5).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. OUTPACE_ZOO=$PWD/zoo
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -n 3 -p no:cacheprovider tests/bench/test_widen_families.py -k bf16 \
  tests/layers/test_row_streams.py tests/kernels/test_fp8_linear.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 12
timeout 200 python3 benchmarks/scripts/decode_settings.py $OUT/sweeps row_streams_v2_fp8 row_streams_qwen3next_fp8 \
  row_streams_step_fp8 > $OUT/settings.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/settings.log
timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam_fp8 --no-verify --quantized fp8 \
  --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/fam_fp8.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_fp8.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "step ms|^ *[0-9.]+  |rc=|Error" $OUT/settings.log | tail -n 20
grep -E "%|rc=|Error" $OUT/fam_fp8.log | tail -n 12
